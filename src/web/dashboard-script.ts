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
    var charts = [];
    [['requests-chart', 'Requests', data.requests], ['revenue-chart', 'Revenue', data.revenue]].forEach(function (spec) {
      var el = document.getElementById(spec[0]);
      if (!el) return;
      charts.push({ el: el, plot: new uPlot({
        width: el.clientWidth, height: 220, tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), 'Etc/UTC'); },
        // The days themselves, with half a day of margin on each side: a range of one day is a point in
        // the middle. (For a single point uPlot proposes 86400 / ms seconds, about 1000 days.)
        scales: { x: { time: true, range: function () { return [xs[0] - 43200, xs[xs.length - 1] + 43200]; } } },
        series: [{}, { label: spec[1], stroke: '#0b5394', fill: 'rgba(11,83,148,0.12)', points: { size: 6 } }],
        axes: [{}, { size: 70 }], legend: { show: true }
      }, [xs, spec[2]], el) });
    });
    // The charts follow the page's width (a phone turned, a window resized).
    window.addEventListener('resize', function () {
      charts.forEach(function (c) { c.plot.setSize({ width: c.el.clientWidth, height: 220 }); });
    });
  }
  document.addEventListener('DOMContentLoaded', drawCharts);
})();
`;
