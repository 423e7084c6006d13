/**
 * The script of the dashboard's forms, served at /assets/forms.js. Every form works without it;
 * with it, the meter price preview follows the form as the merchant types (asking
 * /dashboard/meters/preview, a GET that changes nothing), and Copy buttons (hidden until this
 * script shows them) copy the text of the element they name.
 */
export const FORMS_JS = `
(function () {
  'use strict';
  function fieldValue(form, name) {
    var el = form && form.elements.namedItem(name);
    return el && 'value' in el ? el.value : null;
  }
  function livePreview() {
    var card = document.querySelector('form[data-preview-source]');
    var out = document.getElementById('preview-fee');
    if (!card || !out) return;
    var source = document.getElementById(card.getAttribute('data-preview-source'));
    var timer = null;
    var asked = 0;
    function update() {
      var query = new URLSearchParams();
      ['rate_type', 'tier_type', 'token_basis', 'base_cost_payer', 'service_charge_payer', 'tiers'].forEach(function (name) {
        var value = fieldValue(source, name);
        if (value === null) value = fieldValue(card, name);
        if (value !== null) query.set(name, value);
      });
      ['units', 'used', 'cost'].forEach(function (name) { query.set(name, fieldValue(card, name) || ''); });
      var mine = ++asked;
      fetch(card.getAttribute('data-preview-url') + '?' + query.toString(), { credentials: 'same-origin', headers: { accept: 'application/json' } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (answer) { if (answer && mine === asked) out.innerHTML = answer.fee; });
    }
    function later() { clearTimeout(timer); timer = setTimeout(update, 150); }
    [source, card].forEach(function (form) {
      if (!form) return;
      form.addEventListener('input', later);
      form.addEventListener('change', later);
    });
  }
  function copyButtons() {
    document.querySelectorAll('button[data-copy]').forEach(function (button) {
      var target = document.getElementById(button.getAttribute('data-copy'));
      var said = document.getElementById(button.getAttribute('data-copy') + '-copied');
      if (!target || !navigator.clipboard) return;
      button.hidden = false;
      button.addEventListener('click', function () {
        var text = 'value' in target ? target.value : target.textContent;
        navigator.clipboard.writeText(text).then(function () { if (said) said.textContent = 'Copied.'; },
          function () { if (said) said.textContent = 'Could not copy; select the text and copy it.'; });
      });
    });
  }
  document.addEventListener('DOMContentLoaded', function () { livePreview(); copyButtons(); });
})();
`;
