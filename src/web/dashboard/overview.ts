import type { FastifyInstance } from 'fastify';
import { ApiError } from '../../http/errors.ts';
import type { AppDeps } from '../../app-deps.ts';
import { nowOf } from '../../http/types.ts';
import { usageLeaders, usageReport, type UsageLeaderRow, type UsageLeaders, type UsageReport } from '../../services/usage-reports.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html, jsonIsland } from '../html.ts';
import { dayRangeOf } from './day-range.ts';
import { merchantOf, sendDashboardPage } from './shell.ts';

/** How many customers and models the overview ranks. */
const LEADERS = 5;

/** UTC offsets offered for the day boundaries (whole hours plus the common half and quarter ones). */
const OFFSETS = [
  ...Array.from({ length: 27 }, (_, i) => i - 12).map((h) => `${h < 0 ? '-' : '+'}${String(Math.abs(h)).padStart(2, '0')}:00`),
  '+03:30', '+04:30', '+05:30', '+05:45', '+06:30', '+09:30', '-03:30',
].sort((a, b) => offsetMinutes(a) - offsetMinutes(b));

function offsetMinutes(offset: string): number {
  const sign = offset.startsWith('-') ? -1 : 1;
  return sign * (Number(offset.slice(1, 3)) * 60 + Number(offset.slice(4, 6)));
}

type OverviewQuery = { start?: string; end?: string; tz?: string };

export function registerOverviewPage(app: FastifyInstance, deps: AppDeps): void {
  app.get('/dashboard', async (request, reply) => {
    const q = request.query as OverviewQuery;
    const now = nowOf(deps);
    const tz = OFFSETS.includes(q.tz ?? '') ? q.tz! : '+00:00';
    const { from: start, to: end } = dayRangeOf({ from: q.start, to: q.end }, now);
    let report: UsageReport | null = null;
    let leaders: UsageLeaders | null = null;
    let names: Map<string, string> = new Map();
    let problem: string | null = null;
    try {
      const range = { start: `${start}T00:00:00${tz}`, end: `${end}T00:00:00${tz}` };
      report = await usageReport(deps.storage, merchantOf(request), range, new Date(now));
      if (report.totals.total_requests > 0) {
        leaders = await usageLeaders(deps.storage, merchantOf(request), range, new Date(now), LEADERS);
        names = await customerNames(deps.storage, merchantOf(request), leaders.customers.map((c) => c.key));
      }
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      problem = e.message;
    }
    const fmt = formatsFor(deps.config.currency);
    return sendDashboardPage(request, reply, '/dashboard', {
      title: 'Overview',
      scripts: report && report.totals.total_requests > 0 ? ['/assets/uplot.js', '/assets/dashboard.js'] : [],
      styles: report && report.totals.total_requests > 0 ? ['/assets/uplot.css'] : [],
      main: html`<h1>Overview</h1>
<form class="card filters" method="get" action="/dashboard" aria-label="Date range">
<div><label for="start">From</label><input id="start" name="start" type="date" value="${start}"></div>
<div><label for="end">To</label><input id="end" name="end" type="date" value="${end}"></div>
<div><label for="tz">Timezone (UTC offset)</label><select id="tz" name="tz">
${OFFSETS.map((o) => html`<option value="${o}"${o === tz ? html` selected` : ''}>UTC${o}</option>`)}
</select></div>
<div><button type="submit">Show</button></div>
</form>
${problem ? html`<p class="error" role="alert">${problem}</p>` : ''}
${report ? reportSection(report, fmt) : ''}
${leaders ? leadersSection(leaders, fmt, names) : ''}`,
    });
  });
}

function reportSection(report: UsageReport, fmt: Formats) {
  const t = report.totals;
  if (t.total_requests === 0) {
    return html`<div class="card"><h2>No requests in this range yet</h2>
<p>Record a first request with your secret key, for example:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/requests -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" \\
  -d '{"request_id":"first-1","customer_id":"con_…","meter_slug":"…","input_tokens":1000,"output_tokens":500}'</pre>
<p>Create a <a href="/dashboard/meters">meter</a> and a <a href="/dashboard/customers">customer</a> first if you have none.</p></div>`;
  }
  const chartData = {
    days: report.items.map((i) => i.date),
    requests: report.items.map((i) => i.total_requests),
    revenue: report.items.map((i) => Number(i.total_fee_amount)),
  };
  return html`<div class="card stats" aria-label="Totals">
<div><h2>Requests</h2><p class="num" id="total-requests">${fmt.count(t.total_requests)}</p></div>
<div><h2>Revenue (fees)</h2><p class="num" id="total-fee">${fmt.money(t.total_fee_amount)}</p></div>
<div><h2>Total request cost</h2><p class="num" id="total-cost">${fmt.money(t.total_request_cost)}</p></div>
<div><h2>Tokens</h2><p class="num">${fmt.count(t.total_usage_tokens)}</p></div>
</div>
<div class="card"><h2 id="requests-chart-title">Requests per day</h2><div class="chart" id="requests-chart" role="img" aria-labelledby="requests-chart-title"></div></div>
<div class="card"><h2 id="revenue-chart-title">Revenue per day</h2><div class="chart" id="revenue-chart" role="img" aria-labelledby="revenue-chart-title"></div></div>
${jsonIsland('usage-data', chartData)}
<div class="card"><h2>By day</h2><div class="table-wrap" tabindex="0" role="region" aria-label="Usage by day"><table>
<caption class="visually-hidden">Usage per day, the same numbers as GET /v1/usage</caption>
<thead><tr><th scope="col">Date</th><th scope="col" class="num">Requests</th><th scope="col" class="num">Tokens</th><th scope="col" class="num">Base cost</th><th scope="col" class="num">Fees</th><th scope="col" class="num">Service charge</th><th scope="col" class="num">Total</th></tr></thead>
<tbody>
${report.items.map(
  (i) => html`<tr><th scope="row">${i.date}</th><td class="num">${fmt.count(i.total_requests)}</td><td class="num">${fmt.count(i.total_usage_tokens)}</td><td class="num">${fmt.money(i.total_usage_cost)}</td><td class="num">${fmt.money(i.total_fee_amount)}</td><td class="num">${fmt.money(i.total_service_charge_amount)}</td><td class="num">${fmt.money(i.total_request_cost)}</td></tr>`,
)}
</tbody></table></div></div>`;
}

function leadersTable(fmt: Formats, id: string, title: string, keyHeader: string, rows: UsageLeaderRow[], keyCell: (key: string) => ReturnType<typeof html>) {
  return html`<div class="card"><h2 id="${id}-title">${title}</h2>
${rows.length === 0 ? html`<p>None in this range.</p>` : html`<div class="table-wrap" tabindex="0" role="region" aria-labelledby="${id}-title"><table id="${id}" aria-labelledby="${id}-title">
<thead><tr><th scope="col">${keyHeader}</th><th scope="col" class="num">Requests</th><th scope="col" class="num">Tokens</th><th scope="col" class="num">Fees</th><th scope="col" class="num">Total</th></tr></thead>
<tbody>
${rows.map(
  (r) => html`<tr><th scope="row">${keyCell(r.key)}</th><td class="num">${fmt.count(r.total_requests)}</td><td class="num">${fmt.count(r.total_usage_tokens)}</td><td class="num">${fmt.money(r.total_fee_amount)}</td><td class="num">${fmt.money(r.total_request_cost)}</td></tr>`,
)}
</tbody></table></div>`}</div>`;
}

/** Top customers and models for the same days as the totals above (ranked by total request cost). */
function leadersSection(leaders: UsageLeaders, fmt: Formats, names: Map<string, string>) {
  return html`${leadersTable(fmt, 'top-customers', 'Top customers', 'Customer', leaders.customers, (key) => customerLink(key, names))}
${leadersTable(fmt, 'top-models', 'Top models', 'Model', leaders.models, (key) => (key ? html`<code>${key}</code>` : html`<span class="muted">no model given</span>`))}`;
}
