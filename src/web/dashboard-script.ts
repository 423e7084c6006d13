/**
 * The dashboard's only script, served at /assets/dashboard.js: draws the overview charts from the
 * JSON island the server rendered (the same numbers as the table beside it) and copies secrets.
 */
export const DASHBOARD_JS = `
(function () {
  'use strict';
  function drawCharts() {
    var island = document.getElementById('usage-data');
    if (!island || typeof uPlot === 'undefined') return;
    var data = JSON.parse(island.textContent);
    var xs = data.days.map(function (d) { return Date.parse(d + 'T12:00:00Z') / 1000; });
    [['requests-chart', 'Requests', data.requests], ['revenue-chart', 'Revenue', data.revenue]].forEach(function (spec) {
      var el = document.getElementById(spec[0]);
      if (!el) return;
      var width = Math.max(280, el.clientWidth);
      new uPlot({
        width: width, height: 220, tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), 'Etc/UTC'); },
        series: [{}, { label: spec[1], stroke: '#0b5394', fill: 'rgba(11,83,148,0.12)' }],
        axes: [{}, { size: 70 }], legend: { show: true }
      }, [xs, spec[2]], el);
    });
  }
  document.addEventListener('DOMContentLoaded', drawCharts);
})();
`;
