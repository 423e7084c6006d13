import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { presentSubscription } from '../../commerce/subscription-view.ts';
import { MAX_WALLET_BALANCE_UNITS, parseMoney } from '../../domain/money.ts';
import { positiveDecimal } from '../../http/schemas.ts';
import { nowIsoOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { walletBuckets, walletCredits, type WalletBuckets, type WalletCredit } from '../../ledger/wallet-history.ts';
import { grantCredit, WalletBalanceLimitError } from '../../ledger/wallets.ts';
import { findConnection, listConnections, type ConnectionWithBalance } from '../../storage/connections.ts';
import { findCustomerSubscriptionView } from '../../storage/subscriptions.ts';
import { changeCustomer, createCustomer, customerCreateBody, customerUpdateBody } from '../../services/customers.ts';
import { formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { formSummary, formText, submit, textField, type FieldErrors, type Form, type FormSpec } from './form-fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';
import { cancelLink } from './subscriptions.ts';

const PAGE_SIZE = 50;
const CREDITS_SHOWN = 50;
const MAX_DESCRIPTION = 255;

const CREDIT_KIND_LABELS: Record<string, string> = {
  credit_grant: 'Granted by you',
  operator_credit: 'Operator credit',
  customer_payment: 'Customer payment',
  plan_credit: 'Plan credit',
};

type GrantForm = { amount: string; description: string; error?: string };
type DetailsForm = { form: Form; errors: FieldErrors };

const DETAIL_FIELDS = ['name', 'email', 'reference_id', 'phone'] as const;
const CUSTOMER_FORM: FormSpec = {
  labels: { name: 'Name', email: 'Email', reference_id: 'Reference id', phone: 'Phone' },
  fieldOf: (path) => (path[0] === 'first_name' || path[0] === 'last_name' ? 'name' : String(path[0] ?? '')),
  codeFields: { reference_id_taken: 'reference_id' },
};

/**
 * The details form as the body POST or PATCH /v1/customers takes. A blank field is left out of
 * a new customer and, on a customer being changed, sent as null: its value removed.
 */
function customerBody(form: Form, blank: 'omit' | 'null'): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const field of DETAIL_FIELDS) {
    const value = formText(form, field);
    if (value) body[field] = value;
    else if (blank === 'null') body[field] = null;
  }
  return body;
}

/** What a customer's details look like in the form. */
function formOfCustomer(c: ConnectionWithBalance): Form {
  return { name: [c.first_name, c.last_name].filter(Boolean).join(' '), email: c.email ?? '', reference_id: c.reference_id ?? '', phone: c.phone ?? '' };
}

function detailFields(prefix: string, form: Form, errors: FieldErrors | undefined) {
  const field = (name: (typeof DETAIL_FIELDS)[number], extra: ReturnType<typeof html>, hint?: string) =>
    textField({ id: `${prefix}-${name.replace('_', '-')}`, name, label: CUSTOMER_FORM.labels[name]!, value: form[name] ?? '', errors, extra, ...(name === 'email' ? { type: 'email' } : {}), ...(hint ? { hint } : {}) });
  return html`${field('name', html` maxlength="255" autocomplete="off"`)}
${field('email', html` maxlength="255" autocomplete="off"`)}
${field('reference_id', html` maxlength="255" autocomplete="off"`, 'Your own id for this customer (e.g. your user id); the API finds the customer by it wherever it takes a customer id.')}
${field('phone', html` maxlength="32" autocomplete="off"`)}`;
}

const displayName = (c: ConnectionWithBalance) => [c.first_name, c.last_name].filter(Boolean).join(' ') || c.email || '—';

/** The amount field as the API's POST /customers/{id}/credits reads it: a decimal string, never a float. */
function grantAmount(text: string): bigint | string {
  const checked = positiveDecimal.safeParse(text.trim());
  if (!checked.success) {
    return 'Enter the amount as a positive decimal number with at most 10 digits after the point, e.g. 25.00.';
  }
  return parseMoney(checked.data);
}

export function registerCustomerPages(app: FastifyInstance, deps: AppDeps): void {
  const listPage = async (request: FastifyRequest<{ Querystring: { cursor?: string } }>, reply: FastifyReply, create: DetailsForm & { status: number } = { form: {}, errors: {}, status: 200 }) => {
    const merchantId = merchantOf(request);
    const cursor = request.query.cursor || undefined;
    const rows = await listConnections(deps.storage, merchantId, { limit: PAGE_SIZE, ...(cursor ? { cursor } : {}) });
    const page = rows.slice(0, PAGE_SIZE);
    const next = rows.length > PAGE_SIZE ? page[page.length - 1]!.id : null;
    const buckets = await walletBuckets(deps.storage, merchantId, page.map((c) => c.wallet_id));
    return sendDashboardPage(request, reply, '/dashboard/customers', {
      title: 'Customers',
      status: create.status,
      main: html`<h1>Customers</h1>
${page.length === 0 && !cursor ? emptyCustomers() : customerTable(page, buckets, formatsFor(deps.config.currency))}
${next ? html`<p><a class="button secondary" href="/dashboard/customers?cursor=${encodeURIComponent(next)}" rel="next">More customers</a></p>` : ''}
<form class="card" method="post" action="/dashboard/customers" novalidate>
${csrfField(request, reply)}
<h2>Create a customer</h2>
<p class="muted">Every field is optional; the customer gets a wallet of its own. As <code>POST /v1/customers</code>: a reference id a customer already has opens that customer.</p>
${formSummary(create.errors, 'customer-create-error')}
${detailFields('new-customer', create.form, create.errors)}
<button type="submit">Create customer</button>
</form>`,
    });
  };

  app.get<{ Querystring: { cursor?: string } }>('/dashboard/customers', (request, reply) => listPage(request, reply));

  app.post<{ Querystring: { cursor?: string } }>('/dashboard/customers', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const done = await submit(customerCreateBody, customerBody(form, 'omit'), CUSTOMER_FORM, (body) => createCustomer(deps, merchantOf(request), body));
    if (!done.ok) return listPage(request, reply, { form, errors: done.errors, status: done.status });
    const { customer, created } = done.value;
    return reply.redirect(`/dashboard/customers/${encodeURIComponent(customer.customer_id)}?${created ? 'created' : 'existing'}=1`, 303);
  });

  app.post<{ Params: { id: string } }>('/dashboard/customers/:id', async (request, reply) => {
    assertCsrf(request);
    const customer = await customerOf(deps, request);
    const form = (request.body ?? {}) as Form;
    const done = await submit(customerUpdateBody, customerBody(form, 'null'), CUSTOMER_FORM, (body) => changeCustomer(deps, merchantOf(request), customer.id, body));
    if (!done.ok) return customerPage(deps, request, reply, { grant: { amount: '', description: '' }, details: { form, errors: done.errors }, status: done.status });
    return reply.redirect(`/dashboard/customers/${encodeURIComponent(customer.id)}?saved=1`, 303);
  });

  app.get<{ Params: { id: string }; Querystring: { granted?: string; created?: string; existing?: string; saved?: string } }>('/dashboard/customers/:id', async (request, reply) => {
    const { granted, created, existing, saved } = request.query;
    const notice = created ? 'Customer created.' : existing ? 'A customer already has this reference id; this is that customer, unchanged.' : saved ? 'Details saved.' : undefined;
    return customerPage(deps, request, reply, { grant: { amount: '', description: '' }, granted, notice });
  });

  app.post<{ Params: { id: string } }>('/dashboard/customers/:id/credits', async (request, reply) => {
    assertCsrf(request);
    const merchantId = merchantOf(request);
    const customer = await customerOf(deps, request);
    const body = request.body as Record<string, unknown>;
    const form: GrantForm = { amount: String(body.amount ?? ''), description: String(body.description ?? '').trim() };
    const amount = grantAmount(form.amount);
    if (typeof amount === 'string') return customerPage(deps, request, reply, { grant: { ...form, error: amount }, status: 400 });
    if (form.description.length > MAX_DESCRIPTION) {
      return customerPage(deps, request, reply, { grant: { ...form, error: `Keep the description under ${MAX_DESCRIPTION} characters.` }, status: 400 });
    }
    // The same ledger operation as POST /v1/customers/{id}/credits.
    const grant = await grantCredit(deps.storage, { merchantId, walletId: customer.wallet_id, amount, description: form.description || null, at: nowIsoOf(deps) }).catch(
      (e: unknown) => {
        if (e instanceof WalletBalanceLimitError) return null;
        throw e;
      },
    );
    if (!grant) {
      const error = `This grant would take the balance above the most a wallet may hold, ${formatsFor(deps.config.currency).moneyText(MAX_WALLET_BALANCE_UNITS)}.`;
      return customerPage(deps, request, reply, { grant: { ...form, error }, status: 422 });
    }
    return reply.redirect(`/dashboard/customers/${encodeURIComponent(customer.id)}?granted=${encodeURIComponent(grant.transactionId)}`, 303);
  });
}

async function customerOf(deps: AppDeps, request: FastifyRequest<{ Params: { id: string } }>): Promise<ConnectionWithBalance> {
  const customer = await findConnection(deps.storage, merchantOf(request), request.params.id);
  if (!customer) throw new WebError(404, `No customer with id ${request.params.id}.`);
  return customer;
}

async function customerPage(
  deps: AppDeps,
  request: FastifyRequest<{ Params: { id: string } }>,
  reply: FastifyReply,
  opts: { grant: GrantForm; granted?: string | undefined; notice?: string | undefined; details?: DetailsForm; status?: number },
): Promise<FastifyReply> {
  const merchantId = merchantOf(request);
  const customer = await customerOf(deps, request);
  const [buckets, credits, subscription] = await Promise.all([
    walletBuckets(deps.storage, merchantId, [customer.wallet_id]),
    walletCredits(deps.storage, merchantId, customer.wallet_id, CREDITS_SHOWN),
    findCustomerSubscriptionView(deps.storage, merchantId, customer.id),
  ]);
  const wallet = buckets.get(customer.wallet_id)!;
  const granted = opts.granted ? credits.find((c) => c.transactionId === opts.granted) : undefined;
  const sub = subscription && subscription.status !== 'cancelled' ? presentSubscription(subscription) : null;
  const error = opts.grant.error;
  const fmt = formatsFor(deps.config.currency);
  return sendDashboardPage(request, reply, '/dashboard/customers', {
    title: `Customer ${customer.id}`,
    status: opts.status,
    main: html`<h1>Customer <span class="secret">${customer.id}</span></h1>
${opts.notice ? html`<p class="notice" role="status" id="customer-notice">${opts.notice}</p>` : ''}
${granted ? html`<p class="notice" role="status" id="grant-notice">Granted ${fmt.money(granted.amount)}. The balance is now ${fmt.money(wallet.balance)}.</p>` : ''}
<div class="card"><h2>Details</h2><dl class="kv">
<dt>Name</dt><dd>${displayName(customer)}</dd><dt>Email</dt><dd>${customer.email ?? '—'}</dd>
<dt>Reference</dt><dd>${customer.reference_id ?? '—'}</dd><dt>Wallet</dt><dd><code>${customer.wallet_id}</code></dd>
<dt>Subscription</dt><dd>${sub ? html`<a href="/dashboard/subscriptions">${sub.plan.name}</a> (${sub.status}${sub.pending_change ? html`, ${sub.pending_change.type} at cycle end` : ''}) <span class="actions">${cancelLink(sub, new Map([[customer.id, displayName(customer)]]))}</span>` : 'none'}</dd>
<dt>Created</dt><dd>${customer.created_at}</dd>
</dl></div>
${walletCard(wallet, fmt)}
<form class="card" method="post" action="/dashboard/customers/${customer.id}/credits" novalidate>
${csrfField(request, reply)}
<h2>Grant credit</h2>
<p class="muted">Adds to the prepaid bucket of this customer's wallet, as <code>POST /v1/customers/{id}/credits</code> does.</p>
${error ? html`<p class="error" role="alert" id="grant-error">${error}</p>` : ''}
<label for="grant-amount">Amount</label>
<input id="grant-amount" name="amount" inputmode="decimal" autocomplete="off" value="${opts.grant.amount}" placeholder="25.00" required${error ? html` aria-invalid="true" aria-describedby="grant-error"` : ''}>
<label for="grant-description">Description (optional)</label>
<input id="grant-description" name="description" maxlength="${MAX_DESCRIPTION}" value="${opts.grant.description}">
<button type="submit">Grant credit</button>
</form>
<form class="card" method="post" action="/dashboard/customers/${customer.id}" novalidate>
${csrfField(request, reply)}
<h2>Edit details</h2>
<p class="muted">A blank field removes its value, as <code>PATCH /v1/customers/{id}</code> with null does.</p>
${formSummary(opts.details?.errors, 'customer-edit-error')}
${detailFields('customer', opts.details?.form ?? formOfCustomer(customer), opts.details?.errors)}
<button type="submit">Save details</button>
</form>
${creditsCard(credits, fmt)}
<p><a href="/dashboard/requests?customer=${encodeURIComponent(customer.id)}">This customer's requests</a> · <a href="/dashboard/customers">All customers</a></p>`,
  });
}

function walletCard(w: WalletBuckets, fmt: Formats) {
  return html`<div class="card"><h2>Wallet</h2><dl class="kv" id="wallet-buckets">
<dt>Balance</dt><dd id="wallet-balance">${fmt.money(w.balance)}</dd>
<dt>Prepaid</dt><dd id="wallet-prepaid">${fmt.money(w.prepaid)}</dd>
<dt>Plan cycle credit</dt><dd id="wallet-cycle">${fmt.money(w.cycle)}</dd>
<dt>Bundle credit</dt><dd id="wallet-bundle">${fmt.money(w.bundle)}</dd>
<dt>Held by requests in flight</dt><dd>${fmt.money(w.held)}</dd>
<dt>Available</dt><dd>${fmt.money(w.available)}</dd>
</dl></div>`;
}

function creditsCard(credits: WalletCredit[], fmt: Formats) {
  return html`<div class="card"><h2 id="credits-title">Credit grants</h2>
${
  credits.length === 0
    ? html`<p>No credit yet. Grant some above, or sell credit with a plan's bundles.</p>`
    : html`<div class="table-wrap" tabindex="0" role="region" aria-labelledby="credits-title"><table id="credits" aria-labelledby="credits-title">
<thead><tr><th scope="col">Date (UTC)</th><th scope="col">Source</th><th scope="col">Bucket</th><th scope="col" class="num">Amount</th><th scope="col">Description</th></tr></thead>
<tbody>${credits.map(
        (c) => html`<tr><td>${c.createdAt.slice(0, 19).replace('T', ' ')}</td><td>${CREDIT_KIND_LABELS[c.kind] ?? c.kind}</td><td>${c.bucket}</td><td class="num">${fmt.money(c.amount)}</td><td>${c.description ?? ''}</td></tr>`,
      )}</tbody></table></div>`
}</div>`;
}

function customerTable(rows: ConnectionWithBalance[], buckets: Map<string, WalletBuckets>, fmt: Formats) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Customers"><table>
<caption class="visually-hidden">Customers, newest first, with their wallet buckets</caption>
<thead><tr><th scope="col">Customer</th><th scope="col">Name</th><th scope="col">Reference</th><th scope="col" class="num">Balance</th><th scope="col" class="num">Prepaid</th><th scope="col" class="num">Cycle</th><th scope="col" class="num">Bundle</th></tr></thead>
<tbody>
${rows.map((c) => {
  const w = buckets.get(c.wallet_id);
  return html`<tr><th scope="row"><a href="/dashboard/customers/${c.id}">${c.id}</a></th><td>${displayName(c)}</td><td>${c.reference_id ?? '—'}</td>
<td class="num">${fmt.money(c.balance)}</td><td class="num">${w ? fmt.money(w.prepaid) : '—'}</td><td class="num">${w ? fmt.money(w.cycle) : '—'}</td><td class="num">${w ? fmt.money(w.bundle) : '—'}</td></tr>`;
})}
</tbody></table></div>`;
}

function emptyCustomers() {
  return html`<div class="card"><h2>No customers yet</h2>
<p>A customer is someone you bill; each has a wallet. Create one with the form below, or with your secret key:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/customers -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" -d '{"reference_id":"user-42","email":"ada@example.com"}'</pre>
<p>Then grant it credit here, or record its first request.</p></div>`;
}
