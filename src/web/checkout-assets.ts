/**
 * The hosted checkout page's only assets, served by Tollgate itself (the page loads nothing from
 * elsewhere, and its Content-Security-Policy allows nothing else).
 */
export const CHECKOUT_CSS = `
*,*::before,*::after{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a1a1a;background:#f4f5f7}
main{max-width:28rem;margin:0 auto;padding:1.25rem}
.card{background:#fff;border-radius:.75rem;padding:1.25rem;box-shadow:0 1px 3px rgba(0,0,0,.12)}
h1{font-size:1.35rem;margin:0 0 .25rem}
.merchant{color:#4a4f57;margin:0 0 1rem}
dl{display:grid;grid-template-columns:auto 1fr;gap:.25rem 1rem;margin:0 0 1.25rem}
dt{color:#4a4f57}dd{margin:0;text-align:right;font-weight:600}
label{display:block;font-weight:600;margin:.75rem 0 .25rem}
input{width:100%;font:inherit;padding:.65rem .75rem;border:1px solid #8a9099;border-radius:.5rem}
input:focus{outline:3px solid #2458d6;outline-offset:1px}
.hint{color:#4a4f57;font-size:.875rem;margin:.25rem 0 0}
button,.button{display:block;width:100%;margin-top:1.25rem;padding:.8rem;font:inherit;font-weight:700;text-align:center;text-decoration:none;color:#fff;background:#2458d6;border:0;border-radius:.5rem;cursor:pointer}
button:focus-visible,.button:focus-visible{outline:3px solid #0b2a6f;outline-offset:2px}
.error{color:#8f1d1d;background:#fdecec;border-radius:.5rem;padding:.75rem;margin:0 0 1rem}
.ok{color:#185c2c;background:#e7f6ec;border-radius:.5rem;padding:.75rem;margin:0 0 1rem}
@media (max-width:24rem){main{padding:.5rem}.card{padding:1rem}}
`.trim();

/** The id of the JSON island ({origin, message}) a completed checkout's page carries. */
export const COMPLETION_ISLAND = 'checkout-completed';

/**
 * Tells the page that opened or embeds the checkout that it completed: posted only to the
 * session's origin (from the page's JSON island), never to `*`.
 */
export const CHECKOUT_JS = `
(function () {
  var island = document.getElementById('${COMPLETION_ISLAND}');
  if (!island) return;
  var data = JSON.parse(island.textContent);
  var target = window.parent !== window ? window.parent : window.opener;
  if (target && data.origin && data.message) target.postMessage(data.message, data.origin);
})();
`.trim();
