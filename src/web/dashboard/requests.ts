import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import type { AppDeps } from '../../app-deps.ts';
import { presentRequest, type RequestRecord } from '../../services/requests.ts';
import { findMeter, listMeters, type MeterRow } from '../../storage/meters.ts';
import { reportsOf } from '../../storage/db.ts';
import { listRequests, type RequestFilters } from '../../storage/request-queries.ts';
import { findRequestByRequestId, type RequestRow } from '../../storage/requests.ts';
import { metadataKeysOf } from '../../storage/request-metadata-keys.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { WebError } from '../session.ts';
import { merchantOf, sendDashboardPage } from './shell.ts';

const PAGE_SIZE = 25;
/** Records read per query while the export streams: every matching record is written, however many. */
const CSV_BATCH = 500;
/** Metadata keys that get a column of their own (in key order). */
const CSV_MAX_METADATA_KEYS = 100;
const STATUSES = ['pending', 'completed', 'error'] as const;

type LogQuery = { customer?: string; meter?: string; status?: string; metadata?: string; from?: string; to?: string; cursor?: string };

const isDate = (v: string | undefined): v is string => typeof v === 'string' && /^\d{4}-\d{2}-\d{2}$/.test(v);
const filled = (v: string | undefined) => (v && v.trim() ? v.trim() : undefined);

/** The form's filters as the same RequestFilters GET /v1/requests uses (dates are UTC days). */
function filtersOf(q: LogQuery): RequestFilters {
  const metadata = filled(q.metadata);
  const pair = metadata?.split('=');
  if (metadata && (!pair || pair.length !== 2 || !pair[0] || !pair[1])) {
    throw new WebError(400, 'Write the metadata filter as key=value, e.g. team=search.');
  }
  const status = STATUSES.find((s) => s === q.status);
  return {
    connectionId: filled(q.customer),
    meterId: filled(q.meter),
    metadata: pair && metadata ? [[pair[0]!, pair[1]!]] : [],
    ...(status ? { status } : {}),
    ...(isDate(q.from) ? { createdFrom: `${q.from}T00:00:00.000Z` } : {}),
    ...(isDate(q.to) ? { createdBefore: new Date(Date.parse(`${q.to}T00:00:00Z`) + 86_400_000).toISOString() } : {}),
  };
}

function queryString(q: LogQuery, extra: Record<string, string> = {}): string {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries({ ...q, ...extra })) if (v && k !== 'cursor') params.set(k, v);
  if (extra.cursor) params.set('cursor', extra.cursor);
  return params.toString();
}

export function registerRequestPages(app: FastifyInstance, deps: AppDeps): void {
  app.get('/dashboard/requests', async (request, reply) => {
    const q = request.query as LogQuery;
    const merchantId = merchantOf(request);
    const rows = await listRequests(reportsOf(deps.storage).db, merchantId, filtersOf(q), { beforePk: filled(q.cursor), limit: PAGE_SIZE });
    const page = rows.slice(0, PAGE_SIZE);
    const next = rows.length > PAGE_SIZE ? page[page.length - 1]!.id : null;
    const meters = await listMeters(deps.storage, merchantId, undefined, 100);
    const names = await customerNames(deps.storage, merchantId, page.map((r) => r.connection_id));
    const fmt = formatsFor(deps.config.currency);
    return sendDashboardPage(request, reply, '/dashboard/requests', {
      title: 'Requests',
      main: html`<h1>Requests</h1>
<form class="card filters" method="get" action="/dashboard/requests" aria-label="Filters">
<div><label for="f-customer">Customer id</label><input id="f-customer" name="customer" value="${q.customer ?? ''}" placeholder="con_…"></div>
<div><label for="f-meter">Meter</label><select id="f-meter" name="meter"><option value="">Any</option>
${meters.slice(0, 100).map((m) => html`<option value="${m.id}"${m.id === q.meter ? html` selected` : ''}>${m.name} (${m.slug})</option>`)}</select></div>
<div><label for="f-status">Status</label><select id="f-status" name="status"><option value="">Any</option>
${STATUSES.map((s) => html`<option${s === q.status ? html` selected` : ''}>${s}</option>`)}</select></div>
<div><label for="f-metadata">Metadata</label><input id="f-metadata" name="metadata" value="${q.metadata ?? ''}" placeholder="key=value"></div>
<div><label for="f-from">From (UTC)</label><input id="f-from" name="from" type="date" value="${q.from ?? ''}"></div>
<div><label for="f-to">To (UTC)</label><input id="f-to" name="to" type="date" value="${q.to ?? ''}"></div>
<div><button type="submit">Filter</button><a class="button secondary" href="/dashboard/requests.csv?${queryString(q)}">Export CSV</a></div>
</form>
${page.length === 0 ? emptyLog(queryString(q) !== '' || Boolean(filled(q.cursor))) : logTable(page, fmt, names)}
${next ? html`<p><a class="button secondary" href="/dashboard/requests?${queryString(q, { cursor: next })}" rel="next">Older requests</a></p>` : ''}`,
    });
  });

  app.get('/dashboard/requests.csv', async (request, reply) => {
    const merchantId = merchantOf(request);
    const filters = filtersOf(request.query as LogQuery);
    const keys = await metadataKeysOf(reportsOf(deps.storage).db, merchantId, filters, CSV_MAX_METADATA_KEYS);
    return reply
      .header('content-type', 'text/csv; charset=utf-8')
      .header('content-disposition', 'attachment; filename="requests.csv"')
      .header('cache-control', 'no-store')
      .send(Readable.from(csvLines(deps, merchantId, filters, keys)));
  });

  app.get<{ Params: { id: string } }>('/dashboard/requests/:id', async (request, reply) => {
    const row = await findRequestByRequestId(deps.storage.db, merchantOf(request), request.params.id);
    if (!row) throw new WebError(404, `No request with id ${request.params.id}.`);
    const meter = row.meter_id ? await findMeter(deps.storage, merchantOf(request), row.meter_id) : undefined;
    const names = await customerNames(deps.storage, merchantOf(request), [row.connection_id]);
    const main = detail(presentRequest(row), { tierType: meter?.tier_type ?? null, meterName: meter?.name ?? null, fmt: formatsFor(deps.config.currency), names });
    return sendDashboardPage(request, reply, '/dashboard/requests', { title: `Request ${row.request_id}`, main });
  });
}

/** Filtered to nothing: say so; nothing at all yet: say how to record a first request. */
function emptyLog(filtered: boolean) {
  if (filtered) {
    return html`<div class="card"><h2>No requests match</h2>
<p>No request matches these filters. <a href="/dashboard/requests">Clear the filters</a> to see every request.</p></div>`;
  }
  return html`<div class="card"><h2>No requests yet</h2>
<p>Requests appear here once your integration records them or forwards them through <code>/v1/forward</code>. Record a first one with your secret key:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/requests -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" \\
  -d '{"request_id":"first-1","customer_id":"con_…","meter_slug":"…","input_tokens":1000,"output_tokens":500}'</pre>
<p>It needs a <a href="/dashboard/meters">meter</a> and a <a href="/dashboard/customers">customer</a>.</p></div>`;
}

function logTable(rows: RequestRow[], fmt: Formats, names: Map<string, string>) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Requests"><table>
<caption class="visually-hidden">Requests, newest first</caption>
<thead><tr><th scope="col">Request</th><th scope="col">Status</th><th scope="col">Customer</th><th scope="col">Model</th><th scope="col" class="num">Usage</th><th scope="col" class="num">Fee</th><th scope="col" class="num">Total cost</th><th scope="col">Created (UTC)</th></tr></thead>
<tbody>
${rows.map((row) => {
  const r = presentRequest(row);
  return html`<tr><td><a href="/dashboard/requests/${encodeURIComponent(r.request_id)}">${r.request_id}</a></td><td>${r.status}</td><td>${customerLink(r.customer_id, names)}</td><td>${r.model ?? '—'}</td>
<td class="num">${usageCell(r, fmt)}</td><td class="num">${fmt.money(r.fee.amount)}</td><td class="num">${fmt.money(r.total_request_cost)}</td><td>${r.created_at.slice(0, 19).replace('T', ' ')}</td></tr>`;
})}
</tbody></table></div>`;
}

type TierType = MeterRow['tier_type'];

/** Whether a record's token counts say anything: not on a record of seconds, characters or images (or its meter's unit) with none. */
function tokensApply(r: RequestRecord, tierType: TierType | null): boolean {
  const u = r.model_usage;
  if (u.input_tokens + u.output_tokens > 0) return true;
  const otherUsage = u.total_seconds > 0 || u.total_characters > 0 || u.output_images > 0;
  return !otherUsage && tierType !== 'minutes' && tierType !== 'characters_1m';
}

/** The usage cell of the log: tokens, or the unit the record was used in. */
function usageCell(r: RequestRecord, fmt: Formats): string {
  const u = r.model_usage;
  if (tokensApply(r, null)) return fmt.count(u.total_tokens);
  if (u.total_seconds > 0) return `${fmt.count(u.total_seconds)} s`;
  if (u.total_characters > 0) return `${fmt.count(u.total_characters)} characters`;
  return `${fmt.count(u.output_images)} images`;
}

/** Seconds of audio (always on a per-minute meter), characters and images, shown on records that have them. */
function mediaUsage(r: RequestRecord, tierType: TierType | null, fmt: Formats) {
  const u = r.model_usage;
  const split = u.input_seconds > 0 && u.output_seconds > 0 ? ` (input ${fmt.count(u.input_seconds)}, output ${fmt.count(u.output_seconds)})` : '';
  return html`${u.total_seconds > 0 || tierType === 'minutes' ? html`<dt>Audio seconds</dt><dd><span id="detail-seconds">${fmt.count(u.total_seconds)}</span>${split}</dd>` : ''}${
    u.total_characters > 0 || tierType === 'characters_1m' ? html`<dt>Characters</dt><dd id="detail-characters">${fmt.count(u.total_characters)}</dd>` : ''
  }${u.output_images > 0 ? html`<dt>Images</dt><dd id="detail-images">${fmt.count(u.output_images)}</dd>` : ''}`;
}

function tokenRows(r: RequestRecord, fmt: Formats) {
  const u = r.model_usage;
  return html`<dt>Input tokens</dt><dd>${fmt.count(u.input_tokens)}</dd>
<dt>of which cached (read)</dt><dd id="detail-cached">${fmt.count(u.cached_input_tokens)}</dd>
<dt>of which cache writes</dt><dd id="detail-cache-write">${fmt.count(u.cache_write_input_tokens)}</dd>
<dt>Output tokens</dt><dd>${fmt.count(u.output_tokens)}</dd>
<dt>of which reasoning</dt><dd id="detail-reasoning">${fmt.count(u.reasoning_tokens)}</dd>
`;
}

type DetailContext = { tierType: TierType | null; meterName: string | null; fmt: Formats; names: Map<string, string> };

function detail(r: RequestRecord, { tierType, meterName, fmt, names }: DetailContext) {
  const money = fmt.money;
  const rate = (value: string) => (r.fee.rate_type === 'percentage' ? fmt.percent(value) : money(value));
  return html`<h1>Request <span class="secret">${r.request_id}</span></h1>
<div class="card"><h2>Summary</h2><dl class="kv">
<dt>Status</dt><dd>${r.status}</dd><dt>Customer</dt><dd>${customerLink(r.customer_id, names)}</dd><dt>Meter</dt><dd>${r.meter_id ? html`<a href="/dashboard/meters/${r.meter_id}" title="${r.meter_id}">${meterName ?? r.meter_id}</a>` : '—'}</dd>
<dt>Provider / model</dt><dd>${r.provider ?? '—'} / ${r.model ?? '—'}</dd><dt>Created</dt><dd>${r.created_at}</dd>
<dt>Metadata</dt><dd>${Object.entries(r.metadata).map(([k, v]) => html`<code>${k}=${v}</code> `)}</dd>
</dl></div>
<div class="card"><h2>Cost breakdown</h2><dl class="kv">
${tokensApply(r, tierType) ? tokenRows(r, fmt) : ''}${mediaUsage(r, tierType, fmt)}<dt>Base cost</dt><dd>${money(r.model_usage.total_cost)} (${r.model_usage.price_unit ? `priced by ${r.model_usage.price_unit}, ` : ''}paid by ${r.model_usage.payer})</dd>
<dt>Fee</dt><dd id="detail-fee">${money(r.fee.amount)} (${r.fee.rate_type}, paid by the wallet)</dd>
<dt>Service charge</dt><dd>${money(r.service_charge.amount)} (paid by ${r.service_charge.payer})</dd>
<dt>Customer wallet pays</dt><dd>${money(r.total_wallet_cost)}</dd><dt>Merchant pays</dt><dd>${money(r.total_merchant_cost)}</dd>
<dt>Total</dt><dd id="detail-total">${money(r.total_request_cost)}</dd>
</dl>
${r.fee.breakdown.length > 0 ? html`<h3>Fee tiers</h3><div class="table-wrap" tabindex="0" role="region" aria-label="Fee tiers"><table><thead><tr><th scope="col">Tier start</th><th scope="col">Rate</th><th scope="col" class="num">Cost</th></tr></thead><tbody>
${r.fee.breakdown.map((b) => html`<tr><td>${fmt.count(b.tier.start)}</td><td>${rate(b.tier.rate)}</td><td class="num">${money(b.cost)}</td></tr>`)}
</tbody></table></div>` : ''}
</div>
<p><a href="/dashboard/requests">All requests</a></p>`;
}

const CSV_COLUMNS = ['request_id', 'status', 'customer_id', 'meter_id', 'provider', 'model', 'input_tokens', 'output_tokens', 'base_cost', 'fee', 'service_charge', 'total_request_cost', 'created_at'];

/**
 * The export, line by line as the records are read (newest first, CSV_BATCH a query): the
 * response starts at once and holds one batch in memory, whatever the number of records. Each
 * metadata key gets a `metadata.<key>` column after the fixed ones.
 */
async function* csvLines(deps: AppDeps, merchantId: string, filters: RequestFilters, keys: string[]): AsyncGenerator<string> {
  yield `${[...CSV_COLUMNS, ...keys.map((k) => `metadata.${k}`)].map(csvCell).join(',')}\r\n`;
  let beforePk: string | undefined;
  for (;;) {
    const rows = await listRequests(reportsOf(deps.storage).db, merchantId, filters, { beforePk, limit: CSV_BATCH });
    const batch = rows.slice(0, CSV_BATCH);
    if (batch.length > 0) yield batch.map((row) => `${csvLine(presentRequest(row), keys)}\r\n`).join('');
    if (rows.length <= CSV_BATCH) return;
    beforePk = batch[batch.length - 1]!.id;
  }
}

function csvLine(r: RequestRecord, keys: string[]): string {
  const cells = [r.request_id, r.status, r.customer_id, r.meter_id, r.provider, r.model, r.model_usage.input_tokens, r.model_usage.output_tokens, r.model_usage.total_cost, r.fee.amount, r.service_charge.amount, r.total_request_cost, r.created_at, ...keys.map((k) => r.metadata[k])];
  return cells.map((c) => csvCell(c === null || c === undefined ? '' : String(c))).join(',');
}

/**
 * Quoted when needed. A cell starting with = + - @, a tab or a CR is prefixed with ' so a
 * spreadsheet never runs it as a formula (-1+1 is one as much as =1+1); only a plain number, such
 * as a negative amount, is left as it is.
 */
export function csvCell(value: string): string {
  const safe = /^[=+\-@\t\r]/.test(value) && !/^-?\d+(\.\d+)?$/.test(value) ? `'${value}` : value;
  return /[",\r\n]/.test(safe) ? `"${safe.replace(/"/g, '""')}"` : safe;
}

