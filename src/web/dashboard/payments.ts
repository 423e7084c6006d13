import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { formatMoney, parseMoney } from '../../domain/money.ts';
import { monthlyRecurringRevenue } from '../../domain/recurring-revenue.ts';
import { ApiError } from '../../http/errors.ts';
import { nowOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { walletBuckets } from '../../ledger/wallet-history.ts';
import { usageReport } from '../../services/usage-reports.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { reportsOf } from '../../storage/db.ts';
import { findMerchant } from '../../storage/merchants.ts';
import { refundedAmounts } from '../../storage/payments.ts';
import { listPayments, liveSubscriptionPrices, receivedByPurpose, refundedInRange, type PaymentFilters, type PaymentListRow, type PaymentPurpose } from '../../storage/payment-reports.ts';
import type { PaymentStatus } from '../../storage/schema.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { dayRangeFields, dayRangeOf, instantsOf } from './day-range.ts';
import { refundLink } from './payment-refunds.ts';
import { csvCell } from './requests.ts';
import { merchantOf, sendDashboardPage } from './shell.ts';

const PAGE_SIZE = 50;
/** Payments the CSV export reads per query. */
const CSV_BATCH = 500;

const PURPOSES: Record<PaymentPurpose, string> = { checkout: 'Checkout', renewal: 'Renewal', auto_top_up: 'Auto top-up' };
const STATUSES: readonly PaymentStatus[] = ['succeeded', 'pending', 'requires_action', 'failed'];

type PaymentsQuery = { from?: string; to?: string; purpose?: string; status?: string; cursor?: string };

/**
 * What came in and what recurs: the payments customers made (checkout, renewals, auto top-ups)
 * and the refunds given back, revenue as payments less refunds plus the usage fees of the same days, monthly recurring revenue and
 * live subscriptions, and the merchant's own wallet.
 */
export function registerPaymentPages(app: FastifyInstance, deps: AppDeps): void {
  app.get('/dashboard/payments', async (request, reply) => {
    const q = request.query as PaymentsQuery;
    const merchantId = merchantOf(request);
    const now = nowOf(deps);
    const { days, range, purpose, status, filters, query } = viewOf(q, now);
    const { from, to } = days;
    const reports = reportsOf(deps.storage);
    const [rows, received, refunded, live, merchant, fees] = await Promise.all([
      listPayments(reports, merchantId, filters, { cursor: q.cursor || undefined, limit: PAGE_SIZE }),
      receivedByPurpose(reports, merchantId, range),
      refundedInRange(reports, merchantId, range),
      liveSubscriptionPrices(reports, merchantId),
      findMerchant(deps.storage, merchantId),
      usageFees(deps, merchantId, from, to, now),
    ]);
    const page = rows.slice(0, PAGE_SIZE);
    const next = rows.length > PAGE_SIZE ? page[page.length - 1]!.id : null;
    const [names, wallets, refundedById] = await Promise.all([
      customerNames(reports, merchantId, page.map((p) => p.connection_id)),
      walletBuckets(deps.storage, merchantId, merchant ? [merchant.wallet_id] : []),
      refundedAmounts(reports.db, page.map((p) => p.id)),
    ]);
    const fmt = formatsFor(deps.config.currency);
    const paid = [...received.values()].reduce((sum, r) => sum + r.amount, 0n);
    const net = paid - refunded.amount;
    const own = merchant ? wallets.get(merchant.wallet_id) : undefined;
    return sendDashboardPage(request, reply, '/dashboard/payments', {
      title: 'Payments and revenue',
      main: html`<h1>Payments and revenue</h1>
<form class="card filters" method="get" action="/dashboard/payments" aria-label="Filters">
${dayRangeFields('p', days)}
<div><label for="p-purpose">Kind</label><select id="p-purpose" name="purpose"><option value="">Any</option>
${Object.entries(PURPOSES).map(([value, label]) => html`<option value="${value}"${value === purpose ? html` selected` : ''}>${label}</option>`)}</select></div>
<div><label for="p-status">Status</label><select id="p-status" name="status"><option value="">Any</option>
${STATUSES.map((s) => html`<option${s === status ? html` selected` : ''}>${s}</option>`)}</select></div>
<div><button type="submit">Show</button><a class="button secondary" href="/dashboard/payments.csv?${query}">Export CSV</a></div>
</form>
<div class="card stats" aria-label="Revenue">
<div><h2>Revenue</h2><p class="num" id="revenue-total">${fees === null ? '—' : fmt.money(net + fees)}</p><p class="muted">payments less refunds, and usage fees, ${from} to ${to}</p></div>
<div><h2>Payments received</h2><p class="num" id="revenue-payments">${fmt.money(paid)}</p></div>
<div><h2>Refunded</h2><p class="num" id="revenue-refunds">${fmt.money(refunded.amount)}</p><p class="muted">${fmt.count(refunded.count)} refunds</p></div>
<div><h2>Usage fees</h2><p class="num" id="revenue-fees">${fees === null ? '—' : fmt.money(fees)}</p></div>
</div>
<div class="card stats" aria-label="Subscriptions and wallet">
<div><h2>Monthly recurring revenue</h2><p class="num" id="mrr">${fmt.money(monthlyRecurringRevenue(live.sums))}</p></div>
<div><h2>Active subscriptions</h2><p class="num" id="active-subscriptions">${fmt.count(live.count)}</p></div>
<div><h2>Your wallet</h2><p class="num" id="merchant-wallet">${own ? fmt.money(own.balance) : '—'}</p><p class="muted">what requests billed to you draw on</p></div>
</div>
${receivedTable(received, refunded, fmt)}
${page.length === 0 ? html`<div class="card"><h2>No payments match</h2><p>Payments appear here when a customer pays at a checkout, a subscription renews or an auto top-up is bought.</p></div>` : paymentTable(page, fmt, names, refundedById)}
${next ? html`<p><a class="button secondary" rel="next" href="/dashboard/payments?${query}&amp;cursor=${encodeURIComponent(next)}">Older payments</a></p>` : ''}`,
    });
  });

  app.get('/dashboard/payments.csv', async (request, reply) => {
    const { filters, days } = viewOf(request.query as PaymentsQuery, nowOf(deps));
    return reply
      .header('content-type', 'text/csv; charset=utf-8')
      .header('content-disposition', `attachment; filename="payments-${days.from}-to-${days.to}.csv"`)
      .header('cache-control', 'no-store')
      .send(Readable.from(csvLines(deps, merchantOf(request), filters)));
  });
}

/** The page's filters from its query: the days (last 30 by default), and a kind and a status if chosen. */
function viewOf(q: PaymentsQuery, now: number) {
  const days = dayRangeOf(q, now);
  const range = instantsOf(days);
  const purpose = (Object.keys(PURPOSES) as PaymentPurpose[]).find((p) => p === q.purpose);
  const status = STATUSES.find((s) => s === q.status);
  const filters: PaymentFilters = { ...range, ...(purpose ? { purpose } : {}), ...(status ? { status } : {}) };
  const query = new URLSearchParams({ ...days, ...(purpose ? { purpose } : {}), ...(status ? { status } : {}) }).toString();
  return { days, range, purpose, status, filters, query };
}

const CSV_COLUMNS = ['payment_id', 'created_at', 'customer_id', 'customer_name', 'kind', 'status', 'failure_reason', 'amount', 'refunded', 'provider', 'provider_reference'];

/**
 * Every payment the page's filters match, newest first, read CSV_BATCH at a time as the response
 * is written: nothing is capped, and one batch is in memory at once. Amounts are exact.
 */
async function* csvLines(deps: AppDeps, merchantId: string, filters: PaymentFilters): AsyncGenerator<string> {
  yield `${CSV_COLUMNS.join(',')}\r\n`;
  const reports = reportsOf(deps.storage);
  let cursor: string | undefined;
  for (;;) {
    const rows = await listPayments(reports, merchantId, filters, { cursor, limit: CSV_BATCH });
    const batch = rows.slice(0, CSV_BATCH);
    const [names, refunded] = await Promise.all([
      customerNames(reports, merchantId, batch.map((p) => p.connection_id)),
      refundedAmounts(reports.db, batch.map((p) => p.id)),
    ]);
    const line = (p: PaymentListRow) =>
      [p.id, p.created_at, p.connection_id ?? '', (p.connection_id && names.get(p.connection_id)) || '', p.purpose, p.status, p.failure_reason ?? '', formatMoney(p.amount), formatMoney(refunded.get(p.id) ?? 0n), p.provider, p.provider_ref ?? '']
        .map(csvCell)
        .join(',');
    if (batch.length > 0) yield batch.map((p) => `${line(p)}\r\n`).join('');
    if (rows.length <= CSV_BATCH) return;
    cursor = batch[batch.length - 1]!.id;
  }
}

/** The usage fees of the same UTC days, as GET /v1/usage totals them; null when the range is refused. */
async function usageFees(deps: AppDeps, merchantId: string, from: string, to: string, now: number): Promise<bigint | null> {
  try {
    const report = await usageReport(deps.storage, merchantId, { start: `${from}T00:00:00+00:00`, end: `${to}T00:00:00+00:00` }, new Date(now));
    return parseMoney(report.totals.total_fee_amount);
  } catch (e) {
    if (e instanceof ApiError) return null;
    throw e;
  }
}

function receivedTable(received: Map<PaymentPurpose, { count: number; amount: bigint }>, refunded: { count: number; amount: bigint }, fmt: Formats) {
  return html`<div class="card"><h2 id="received-title">Received by kind</h2>
<div class="table-wrap" tabindex="0" role="region" aria-labelledby="received-title"><table id="received">
<thead><tr><th scope="col">Kind</th><th scope="col" class="num">Payments</th><th scope="col" class="num">Amount</th></tr></thead>
<tbody>${(Object.entries(PURPOSES) as [PaymentPurpose, string][]).map(([p, label]) => {
    const r = received.get(p) ?? { count: 0, amount: 0n };
    return html`<tr><th scope="row">${label}</th><td class="num">${fmt.count(r.count)}</td><td class="num">${fmt.money(r.amount)}</td></tr>`;
  })}
<tr><th scope="row">Refunds</th><td class="num">${fmt.count(refunded.count)}</td><td class="num">${fmt.money(-refunded.amount)}</td></tr></tbody></table></div></div>`;
}

function paymentTable(rows: PaymentListRow[], fmt: Formats, names: Map<string, string>, refunded: Map<string, bigint>) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Payments"><table id="payments">
<caption class="visually-hidden">Payments, newest first</caption>
<thead><tr><th scope="col">Date (UTC)</th><th scope="col">Customer</th><th scope="col">Kind</th><th scope="col">Status</th><th scope="col" class="num">Amount</th><th scope="col" class="num">Refunded</th><th scope="col">Provider reference</th><th scope="col">Actions</th></tr></thead>
<tbody>
${rows.map(
  (p) => html`<tr id="payment-${p.id}"><td>${p.created_at.slice(0, 16).replace('T', ' ')}</td><td>${customerLink(p.connection_id, names)}</td><td>${PURPOSES[p.purpose]}</td>
<td class="status">${p.status}${p.failure_reason ? html` <span class="muted">(${p.failure_reason})</span>` : ''}</td><td class="num">${fmt.money(p.amount)}</td><td class="num">${refunded.has(p.id) ? fmt.money(refunded.get(p.id)!) : '—'}</td><td><code>${p.provider_ref ?? p.id}</code></td><td class="actions">${refundLink(p)}</td></tr>`,
)}
</tbody></table></div>`;
}
