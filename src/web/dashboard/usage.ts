import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { formatMoney } from '../../domain/money.ts';
import { nowOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { reportsOf } from '../../storage/db.ts';
import { listMeters } from '../../storage/meters.ts';
import { USAGE_GROUPINGS, usageGroups, type UsageGroup, type UsageGrouping } from '../../storage/usage-groups.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html, type SafeHtml } from '../html.ts';
import { dayRangeFields, dayRangeOf, instantsOf, type DayRange } from './day-range.ts';
import { csvCell } from './requests.ts';
import { merchantOf, sendDashboardPage } from './shell.ts';

/** Groups drawn on the page; the CSV has every one, and the page says how many it left out. */
const SHOWN_GROUPS = 50;
const LABELS: Record<UsageGrouping, string> = { model: 'Model', customer: 'Customer', meter: 'Meter', metadata: 'Metadata value' };

type UsageQuery = { from?: string; to?: string; by?: string; key?: string };

type View = DayRange & { by: UsageGrouping; key: string; query: string };

function viewOf(q: UsageQuery, now: number): View {
  const { from, to } = dayRangeOf(q, now);
  const by = USAGE_GROUPINGS.find((g) => g === q.by) ?? 'model';
  const key = (q.key ?? '').trim().slice(0, 255);
  const query = new URLSearchParams({ from, to, by, ...(by === 'metadata' ? { key } : {}) }).toString();
  return { from, to, by, key, query };
}

async function groupsOf(deps: AppDeps, merchantId: string, v: View): Promise<UsageGroup[]> {
  if (v.by === 'metadata' && !v.key) return [];
  return usageGroups(reportsOf(deps.storage), merchantId, { ...instantsOf(v), by: v.by, metadataKey: v.key });
}

/** Names for the groups' keys: customers' and meters' names; models and metadata values are their own. */
async function namesOf(deps: AppDeps, merchantId: string, by: UsageGrouping, groups: UsageGroup[]): Promise<Map<string, string>> {
  if (by === 'customer') return customerNames(reportsOf(deps.storage), merchantId, groups.map((g) => g.key));
  if (by === 'meter') return new Map((await listMeters(deps.storage, merchantId, undefined, 100)).map((m) => [m.id, m.name]));
  return new Map();
}

/**
 * Usage of any range grouped by model, customer, meter or a metadata key: a bar per group (its
 * share of the total cost) and the exact figures, and the same view as CSV.
 */
export function registerUsagePages(app: FastifyInstance, deps: AppDeps): void {
  app.get('/dashboard/usage', async (request, reply) => {
    const merchantId = merchantOf(request);
    const v = viewOf(request.query as UsageQuery, nowOf(deps));
    const groups = await groupsOf(deps, merchantId, v);
    const names = await namesOf(deps, merchantId, v.by, groups);
    const fmt = formatsFor(deps.config.currency);
    return sendDashboardPage(request, reply, '/dashboard/usage', {
      title: 'Usage by group',
      main: html`<h1>Usage by group</h1>
<form class="card filters" method="get" action="/dashboard/usage" aria-label="Range and grouping">
${dayRangeFields('u', v)}
<div><label for="u-by">Group by</label><select id="u-by" name="by">${USAGE_GROUPINGS.map((g) => html`<option value="${g}"${g === v.by ? html` selected` : ''}>${g === 'metadata' ? 'metadata key' : g}</option>`)}</select></div>
<div><label for="u-key">Metadata key</label><input id="u-key" name="key" value="${v.key}" placeholder="e.g. team"></div>
<div><button type="submit">Show</button><a class="button secondary" href="/dashboard/usage.csv?${v.query}">Export CSV</a></div>
</form>
${v.by === 'metadata' && !v.key ? html`<p class="notice" role="status">Enter the metadata key to group by, e.g. <code>team</code>.</p>` : groupsCard(v, groups, names, fmt)}`,
    });
  });

  app.get('/dashboard/usage.csv', async (request, reply) => {
    const merchantId = merchantOf(request);
    const v = viewOf(request.query as UsageQuery, nowOf(deps));
    const groups = await groupsOf(deps, merchantId, v);
    const names = await namesOf(deps, merchantId, v.by, groups);
    return reply
      .header('content-type', 'text/csv; charset=utf-8')
      .header('content-disposition', `attachment; filename="usage-by-${v.by}.csv"`)
      .header('cache-control', 'no-store')
      .send(Readable.from(csvLines(v, groups, names)));
  });
}

function* csvLines(v: View, groups: UsageGroup[], names: Map<string, string>): Generator<string> {
  yield `${[v.by === 'metadata' ? `metadata.${v.key}` : v.by, 'name', 'requests', 'tokens', 'fee', 'total_request_cost', 'from', 'to'].map(csvCell).join(',')}\r\n`;
  for (const g of groups) {
    const cells = [g.key ?? '', g.key ? (names.get(g.key) ?? '') : '', String(g.requests), String(g.tokens), formatMoney(g.fee), formatMoney(g.total), v.from, v.to];
    yield `${cells.map(csvCell).join(',')}\r\n`;
  }
}

function keyCell(by: UsageGrouping, key: string | null, names: Map<string, string>): SafeHtml {
  if (key === null) return html`<span class="muted">none given</span>`;
  if (by === 'customer') return customerLink(key, names);
  if (by === 'meter') return html`<a href="/dashboard/meters/${encodeURIComponent(key)}" title="${key}">${names.get(key) ?? key}</a>`;
  return html`<code>${key}</code>`;
}

function groupsCard(v: View, groups: UsageGroup[], names: Map<string, string>, fmt: Formats) {
  if (groups.length === 0) return html`<div class="card"><h2>No usage in this range</h2><p>No completed request ${v.by === 'metadata' ? html`carries the key <code>${v.key}</code>` : 'was recorded'} between ${v.from} and ${v.to}.</p></div>`;
  const grand = groups.reduce((sum, g) => sum + g.total, 0n);
  const shown = groups.slice(0, SHOWN_GROUPS);
  // The share is for the bar only (whole percent); the figures beside it are exact.
  const share = (g: UsageGroup) => (grand === 0n ? 0 : Number((g.total * 100n) / grand));
  return html`<div class="card"><h2 id="groups-title">By ${LABELS[v.by].toLowerCase()}, ${v.from} to ${v.to}</h2>
${groups.length > shown.length ? html`<p class="muted" id="groups-more">The ${fmt.count(shown.length)} largest of ${fmt.count(groups.length)} groups; the CSV has all of them.</p>` : ''}
<div class="table-wrap" tabindex="0" role="region" aria-labelledby="groups-title"><table id="usage-groups">
<thead><tr><th scope="col">${LABELS[v.by]}</th><th scope="col">Share of total cost</th><th scope="col" class="num">Requests</th><th scope="col" class="num">Tokens</th><th scope="col" class="num">Fees</th><th scope="col" class="num">Total</th></tr></thead>
<tbody>${shown.map(
    (g) => html`<tr><th scope="row">${keyCell(v.by, g.key, names)}</th><td><meter min="0" max="100" value="${share(g)}" aria-label="${share(g)}% of the total cost"></meter> ${share(g)}%</td>
<td class="num">${fmt.count(g.requests)}</td><td class="num">${fmt.count(g.tokens)}</td><td class="num">${fmt.money(g.fee)}</td><td class="num">${fmt.money(g.total)}</td></tr>`,
  )}</tbody></table></div></div>`;
}
