/**
 * The one stylesheet of Tollgate's pages, served at /assets/tollgate.css. Kept in a module (not a
 * .css file) so the compiled build in dist/ carries it without a copy step. Colours meet WCAG AA
 * contrast on their backgrounds; focus is always visible; the layout reflows down to 320 px (wide
 * tables scroll inside their card; the card is positioned so that visually hidden text in a table
 * cannot stretch the page).
 */
export const TOLLGATE_CSS = `
*,*::before,*::after{box-sizing:border-box}
html{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;font-size:16px;line-height:1.5;color:#1a1a1a;background:#f6f6f4}
body{margin:0}
a{color:#0b5394}
a:hover{color:#073763}
:focus-visible{outline:3px solid #b45309;outline-offset:2px}
.skip{position:absolute;left:-999px;top:0;background:#fff;padding:.5rem 1rem;z-index:10}
.skip:focus{left:0}
header.top{background:#1f2933;color:#fff;padding:.5rem 1rem;display:flex;flex-wrap:wrap;align-items:center;gap:.5rem 1rem}
header.top a{color:#fff}
header.top .brand{font-weight:700;text-decoration:none;margin-right:auto}
header.top nav ul{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:.25rem .75rem}
header.top nav a[aria-current="page"]{font-weight:700;text-decoration-thickness:3px}
header.top form{margin:0}
main{max-width:72rem;margin:0 auto;padding:1rem}
h1{font-size:1.5rem;margin:.5rem 0 1rem}
h2{font-size:1.2rem;margin:1.5rem 0 .5rem}
.card{background:#fff;border:1px solid #d0d0cc;border-radius:.5rem;padding:1rem;margin:0 0 1rem}
.narrow{max-width:26rem;margin:2rem auto}
label{display:block;font-weight:600;margin:.75rem 0 .25rem}
input,select,textarea{font:inherit;width:100%;max-width:30rem;padding:.5rem;border:1px solid #6b6b66;border-radius:.25rem;background:#fff;color:#1a1a1a}
input[type=checkbox]{width:auto}
button,.button{font:inherit;display:inline-block;padding:.5rem 1rem;border:1px solid #0b5394;border-radius:.25rem;background:#0b5394;color:#fff;cursor:pointer;text-decoration:none;margin:.5rem .5rem 0 0}
button.secondary,.button.secondary{background:#fff;color:#0b5394}
button.danger,.button.danger{background:#a4161a;border-color:#a4161a;color:#fff}
header.top button{margin:0;padding:.25rem .75rem;background:transparent;border-color:#fff}
.error{color:#a4161a;font-weight:600}
.field .hint,.field .field-error{margin:0 0 .25rem}
.notice{background:#fff7e0;border:1px solid #b45309;padding:.75rem;border-radius:.25rem}
.secret{font-family:ui-monospace,monospace;word-break:break-all;background:#eef3f8;padding:.5rem;border-radius:.25rem}
.table-wrap{overflow-x:auto;position:relative}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
.actions form{display:inline-block}
fieldset{border:1px solid #d0d0cc;border-radius:.25rem;margin:.75rem 0;padding:.5rem .75rem;min-width:0}
.checks label{font-weight:400;margin:.25rem 0}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:.4rem .5rem;border-bottom:1px solid #d0d0cc;overflow-wrap:anywhere}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap;overflow-wrap:normal}
td.actions{white-space:nowrap}
data.rounded{text-decoration:underline dotted;text-underline-offset:.2em}
.filters{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:flex-end}
.filters label{margin:0}
.filters input,.filters select{width:12rem}
.chart{width:100%;min-height:220px;overflow:hidden}
.stats{display:flex;flex-wrap:wrap;gap:1rem}
.stats div{flex:1 1 10rem}
.muted{color:#555}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem}
dl.kv dt{font-weight:600}
dl.kv dd{margin:0;word-break:break-all}
.visually-hidden{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
@media (max-width:40rem){main{padding:.5rem}.filters input,.filters select{width:100%}dl.kv{grid-template-columns:1fr}}
`;
