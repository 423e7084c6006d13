import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CYCLES } from '../../domain/spend-limits.ts';
import { nowOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { pastExpiryIssue, presentSpendKey, spendKeyCreateBody, spendKeySettingsOf, spendKeyUpdateBody } from '../../services/spend-keys.ts';
import { findConnection } from '../../storage/connections.ts';
import { findMerchant } from '../../storage/merchants.ts';
import { findSpendKey, insertSpendKey, listSpendKeys, revokeSpendKey, rotateSpendKey, updateSpendKey, type SpendKeyScope } from '../../storage/spend-keys.ts';
import { plainIssues } from '../form-issues.ts';
import { formatsFor, type Formats } from '../format.ts';
import { html, type SafeHtml } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;

type SpendKey = ReturnType<typeof presentSpendKey>;
type Form = Record<string, string>;
type Flash = { created?: { name: string; key: string }; message?: string; error?: string; form?: Form; status?: number };

const FIELD_LABELS: Record<string, string> = {
  name: 'Name',
  customer_id: 'Customer id',
  spend_limit: 'Spend limit',
  request_limit: 'Request limit',
  rate_limit: 'Requests per minute',
  allowed_models: 'Allowed models',
};

const scopeOf = (request: FastifyRequest): SpendKeyScope => ({ merchantId: merchantOf(request), walletId: null });
const text = (form: Form, name: string) => (form[name] ?? '').trim();
/** A whole number stays a number for the schema; anything else reaches it as text, so it is refused with the API's message. */
const count = (value: string): number | string => (/^\d{1,15}$/.test(value) ? Number(value) : value);

/**
 * The limit fields as the API's body takes them. A blank field is left out when creating (no
 * limit) and sent as null when changing a key (the limit removed).
 */
function limitsBody(form: Form, blank: 'omit' | 'null'): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  const set = (field: string, present: boolean, value: () => unknown) => {
    if (present) body[field] = value();
    else if (blank === 'null') body[field] = null;
  };
  set('spend_limit', text(form, 'spend_amount') !== '', () => ({ amount: text(form, 'spend_amount'), cycle: text(form, 'spend_cycle') }));
  set('request_limit', text(form, 'request_count') !== '', () => ({ count: count(text(form, 'request_count')), cycle: text(form, 'request_cycle') }));
  set('rate_limit', text(form, 'rpm') !== '', () => ({ rpm: count(text(form, 'rpm')) }));
  const models = text(form, 'allowed_models').split(',').map((m) => m.trim()).filter(Boolean);
  set('allowed_models', models.length > 0, () => models);
  return body;
}

/** The form as the body POST /v1/spend_keys takes. */
function bodyOf(form: Form): Record<string, unknown> {
  return {
    name: text(form, 'name') || 'Spend key',
    ...(text(form, 'customer_id') ? { customer_id: text(form, 'customer_id') } : {}),
    ...limitsBody(form, 'omit'),
  };
}

const issueText = (issues: Parameters<typeof plainIssues>[0]) => plainIssues(issues, (path) => FIELD_LABELS[String(path[0])] ?? String(path[0] ?? 'Form'));

/** What a key's limits look like in the form. */
function formOfKey(k: SpendKey): Form {
  return {
    spend_amount: k.spend_limit ? String(k.spend_limit.amount) : '',
    spend_cycle: k.spend_limit?.cycle ?? 'monthly',
    request_count: k.request_limit ? String(k.request_limit.count) : '',
    request_cycle: k.request_limit?.cycle ?? 'monthly',
    rpm: k.rate_limit ? String(k.rate_limit.rpm) : '',
    allowed_models: (k.allowed_models ?? []).join(', '),
  };
}

export function registerSpendKeyPages(app: FastifyInstance, deps: AppDeps): void {
  const page = async (request: FastifyRequest, reply: FastifyReply, flash: Flash = {}) => {
    const now = new Date(nowOf(deps));
    const keys = (await listSpendKeys(deps.storage, scopeOf(request), undefined, LIST_LIMIT)).slice(0, LIST_LIMIT).map((row) => presentSpendKey(row, now));
    return sendDashboardPage(request, reply, '/dashboard/spend-keys', {
      title: 'Spend keys',
      status: flash.status,
      main: html`<h1>Spend keys</h1>
<p>A spend key is a provider-style API key you hand to a customer or a service: requests made with it are billed to a wallet and held to its limits.</p>
${flash.created ? html`<div class="card notice" role="status"><p><strong>Copy the key of “${flash.created.name}” now; it is not shown again.</strong></p>
<p class="secret" id="new-spend-key">${flash.created.key}</p></div>` : ''}
${flash.message ? html`<p role="status" class="notice" id="spend-key-message">${flash.message}</p>` : ''}
${keys.length === 0 ? emptyState() : keyTable(request, reply, keys, formatsFor(deps.config.currency))}
${createForm(request, reply, flash)}`,
    });
  };

  app.get('/dashboard/spend-keys', (request, reply) => page(request, reply));

  app.post('/dashboard/spend-keys', async (request, reply) => {
    assertCsrf(request);
    const merchantId = merchantOf(request);
    const form = (request.body ?? {}) as Form;
    const parsed = spendKeyCreateBody.safeParse(bodyOf(form));
    if (!parsed.success) return page(request, reply, { error: issueText(parsed.error.issues), form, status: 400 });
    const pastExpiry = pastExpiryIssue(parsed.data.expires_at, new Date(nowOf(deps)));
    if (pastExpiry) return page(request, reply, { error: issueText([pastExpiry]), form, status: 400 });
    const { customer_id, connection_id: _c, wallet_id: _w, ...settings } = parsed.data;
    let wallet: { walletId: string; connectionId: string | null };
    if (customer_id) {
      const customer = await findConnection(deps.storage, merchantId, customer_id);
      if (!customer) return page(request, reply, { error: `Customer id: no customer with id ${customer_id}.`, form, status: 400 });
      wallet = { walletId: customer.wallet_id, connectionId: customer.id };
    } else {
      const merchant = await findMerchant(deps.storage, merchantId);
      if (!merchant) throw new WebError(404, 'Your merchant account no longer exists.');
      wallet = { walletId: merchant.wallet_id, connectionId: null };
    }
    const { row, secret } = await insertSpendKey(deps.storage.db, { merchantId, ...wallet, settings: { ...spendKeySettingsOf(settings), name: settings.name } }, new Date(nowOf(deps)));
    return page(request, reply, { created: { name: row.name, key: secret }, status: 201 });
  });

  const detailPage = async (request: FastifyRequest<{ Params: { id: string } }>, reply: FastifyReply, flash: { saved?: boolean; error?: string; form?: Form; status?: number } = {}) => {
    const row = await findSpendKey(deps.storage, scopeOf(request), request.params.id);
    if (!row) throw new WebError(404, `No spend key with id ${request.params.id}.`);
    const k = presentSpendKey(row, new Date(nowOf(deps)));
    const fmt = formatsFor(deps.config.currency);
    return sendDashboardPage(request, reply, '/dashboard/spend-keys', {
      title: `Spend key ${k.name}`,
      status: flash.status,
      main: html`<h1>Spend key ${k.name}</h1>
${flash.saved ? html`<p class="notice" role="status" id="limits-saved">Limits saved.</p>` : ''}
<div class="card"><dl class="kv" id="counters">
<dt>Key</dt><dd><code>${k.key_preview}</code></dd><dt>Status</dt><dd>${k.status}</dd>
<dt>Bills</dt><dd>${k.customer_id ? html`customer <a href="/dashboard/customers/${k.customer_id}">${k.customer_id}</a>` : 'your own wallet'}</dd>
<dt>Spend this cycle</dt><dd id="current-spend">${spendText(fmt, k)}</dd><dt>Spend in total</dt><dd>${fmt.money(k.total_spend)}</dd>
<dt>Requests this cycle</dt><dd id="current-requests">${requestsText(fmt, k)}</dd><dt>Requests in total</dt><dd>${fmt.count(k.total_requests)}</dd>
<dt>Rate limit</dt><dd>${k.rate_limit ? `${k.rate_limit.rpm} per minute` : 'none'}</dd><dt>Last used</dt><dd>${k.last_used_at ?? 'never'}</dd>
</dl></div>
<form class="card" method="post" action="/dashboard/spend-keys/${k.spend_key_id}" novalidate>
${csrfField(request, reply)}
<h2>Limits</h2>
<p class="muted">Leave a field blank to remove that limit.</p>
${flash.error ? html`<p class="error" role="alert" id="spend-key-error">${flash.error}</p>` : ''}
${limitInputs(flash.form ?? formOfKey(k))}
<button type="submit">Save limits</button>
</form>
<div class="card actions"><h2>Actions</h2>${keyActions(request, reply, k)}</div>
<p><a href="/dashboard/spend-keys">All spend keys</a></p>`,
    });
  };

  app.get<{ Params: { id: string }; Querystring: { saved?: string } }>('/dashboard/spend-keys/:id', (request, reply) =>
    detailPage(request, reply, { saved: request.query.saved === '1' }),
  );

  app.post<{ Params: { id: string } }>('/dashboard/spend-keys/:id', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const parsed = spendKeyUpdateBody.safeParse(limitsBody(form, 'null'));
    if (!parsed.success) return detailPage(request, reply, { error: issueText(parsed.error.issues), form, status: 400 });
    const pastExpiry = pastExpiryIssue(parsed.data.expires_at, new Date(nowOf(deps)));
    if (pastExpiry) return detailPage(request, reply, { error: issueText([pastExpiry]), form, status: 400 });
    // The same update as PATCH /v1/spend_keys/{id}: counters carry over as the API's do.
    const row = await updateSpendKey(deps.storage, scopeOf(request), request.params.id, spendKeySettingsOf(parsed.data), new Date(nowOf(deps)));
    if (!row) throw new WebError(404, `No spend key with id ${request.params.id}.`);
    return reply.redirect(`/dashboard/spend-keys/${encodeURIComponent(row.id)}?saved=1`, 303);
  });

  app.post<{ Params: { id: string } }>('/dashboard/spend-keys/:id/status', async (request, reply) => {
    assertCsrf(request);
    const status = (request.body as Form).status === 'paused' ? 'paused' : 'active';
    const row = await updateSpendKey(deps.storage, scopeOf(request), request.params.id, { status }, new Date(nowOf(deps)));
    if (!row) throw new WebError(404, `No spend key with id ${request.params.id}.`);
    return page(request, reply, { message: `${row.name} is ${status === 'paused' ? 'paused: its requests are refused until you resume it' : 'active again'}.` });
  });

  /** The confirmation step of rotate and revoke (see confirm.ts): names the key and what stops working. */
  const confirmStep = async (request: FastifyRequest<{ Params: { id: string } }>, reply: FastifyReply, step: 'rotate' | 'revoke') => {
    const row = await findSpendKey(deps.storage, scopeOf(request), request.params.id);
    if (!row) throw new WebError(404, `No spend key with id ${request.params.id}.`);
    const k = presentSpendKey(row, new Date(nowOf(deps)));
    const action = `/dashboard/spend-keys/${encodeURIComponent(k.spend_key_id)}/${step}`;
    return sendConfirmPage(request, reply, '/dashboard/spend-keys', step === 'rotate'
      ? { question: `Rotate the spend key ${k.name}?`, action, back: '/dashboard/spend-keys', confirmLabel: 'Rotate the key',
          consequence: html`A new key replaces <code>${k.key_preview}</code>, which stops working at once: whoever uses it needs the new one. Its limits and counters stay.` }
      : { question: `Revoke the spend key ${k.name}?`, action, back: '/dashboard/spend-keys', confirmLabel: 'Revoke the key',
          consequence: html`<code>${k.key_preview}</code> stops working at once and for good; requests made with it are refused. This cannot be undone.` });
  };

  app.get<{ Params: { id: string } }>('/dashboard/spend-keys/:id/rotate', (request, reply) => confirmStep(request, reply, 'rotate'));
  app.get<{ Params: { id: string } }>('/dashboard/spend-keys/:id/revoke', (request, reply) => confirmStep(request, reply, 'revoke'));

  app.post<{ Params: { id: string } }>('/dashboard/spend-keys/:id/rotate', async (request, reply) => {
    assertCsrf(request);
    const rotated = await rotateSpendKey(deps.storage, scopeOf(request), request.params.id);
    if (!rotated) throw new WebError(404, `No spend key with id ${request.params.id}.`);
    return page(request, reply, { created: { name: rotated.row.name, key: rotated.secret } });
  });

  app.post<{ Params: { id: string } }>('/dashboard/spend-keys/:id/revoke', async (request, reply) => {
    assertCsrf(request);
    if (!(await revokeSpendKey(deps.storage, scopeOf(request), request.params.id, new Date(nowOf(deps))))) throw new WebError(404, `No spend key with id ${request.params.id}.`);
    return page(request, reply, { message: 'Spend key revoked: it no longer works.' });
  });
}

const limitText = (current: SafeHtml | string, limit: { of: SafeHtml | string; cycle: string } | null) =>
  limit ? html`${current} of ${limit.of} (${limit.cycle})` : html`${current} <span class="muted">(no limit)</span>`;

const spendText = (fmt: Formats, k: SpendKey) =>
  limitText(fmt.money(k.current_spend), k.spend_limit ? { of: fmt.money(String(k.spend_limit.amount)), cycle: k.spend_limit.cycle } : null);

const requestsText = (fmt: Formats, k: SpendKey) =>
  limitText(fmt.count(k.current_requests), k.request_limit ? { of: fmt.count(k.request_limit.count), cycle: k.request_limit.cycle } : null);

/** Pause or resume (at once: it is undone as easily), rotate and revoke (each after a confirmation page). */
function keyActions(request: FastifyRequest, reply: FastifyReply, k: SpendKey) {
  const label = k.status === 'active' ? 'Pause' : 'Resume';
  const base = `/dashboard/spend-keys/${k.spend_key_id}`;
  return html`<form method="post" action="${base}/status">${csrfField(request, reply)}<input type="hidden" name="status" value="${k.status === 'active' ? 'paused' : 'active'}"><button class="secondary" type="submit" aria-label="${label} ${k.name} (${k.key_preview})">${label}</button></form>
${confirmLink(`${base}/rotate`, 'Rotate', `Rotate ${k.name} (${k.key_preview})`)}${confirmLink(`${base}/revoke`, 'Revoke', `Revoke ${k.name} (${k.key_preview})`, true)}`;
}

function keyTable(request: FastifyRequest, reply: FastifyReply, keys: SpendKey[], fmt: Formats) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Spend keys"><table id="spend-keys">
<caption class="visually-hidden">Spend keys with their limits and current counters</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Key</th><th scope="col">Status</th><th scope="col">Customer</th><th scope="col">Spend this cycle</th><th scope="col">Requests this cycle</th><th scope="col">Rate limit</th><th scope="col" class="num">Total spend</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>
${keys.map(
  (k) => html`<tr id="key-${k.spend_key_id}"><th scope="row"><a href="/dashboard/spend-keys/${k.spend_key_id}">${k.name}</a></th><td><code>${k.key_preview}</code></td><td>${k.status}</td>
<td>${k.customer_id ? html`<a href="/dashboard/customers/${k.customer_id}">${k.customer_id}</a>` : html`<span class="muted">your wallet</span>`}</td>
<td class="spend">${spendText(fmt, k)}</td><td class="requests">${requestsText(fmt, k)}</td>
<td>${k.rate_limit ? `${fmt.count(k.rate_limit.rpm)}/min` : '—'}</td><td class="num">${fmt.money(k.total_spend)}</td>
<td class="actions">${keyActions(request, reply, k)}</td></tr>`,
)}
</tbody></table></div>`;
}

function cycleSelect(id: string, name: string, selected: string | undefined) {
  return html`<select id="${id}" name="${name}">${CYCLES.map((c) => html`<option${c === (selected || 'monthly') ? html` selected` : ''}>${c}</option>`)}</select>`;
}

function limitInputs(f: Form) {
  return html`<div class="filters">
<div><label for="sk-spend">Spend limit</label><input id="sk-spend" name="spend_amount" inputmode="decimal" value="${f.spend_amount ?? ''}" placeholder="none"></div>
<div><label for="sk-spend-cycle">Spend limit resets</label>${cycleSelect('sk-spend-cycle', 'spend_cycle', f.spend_cycle)}</div>
</div><div class="filters">
<div><label for="sk-requests">Request limit</label><input id="sk-requests" name="request_count" inputmode="numeric" value="${f.request_count ?? ''}" placeholder="none"></div>
<div><label for="sk-request-cycle">Request limit resets</label>${cycleSelect('sk-request-cycle', 'request_cycle', f.request_cycle)}</div>
</div>
<label for="sk-rpm">Requests per minute</label><input id="sk-rpm" name="rpm" inputmode="numeric" value="${f.rpm ?? ''}" placeholder="no rate limit">
<label for="sk-models">Allowed models (comma-separated; blank: any)</label><input id="sk-models" name="allowed_models" value="${f.allowed_models ?? ''}">`;
}

function createForm(request: FastifyRequest, reply: FastifyReply, flash: Flash) {
  const f = flash.form ?? {};
  const invalid = flash.error ? html` aria-describedby="spend-key-error"` : '';
  return html`<form class="card" method="post" action="/dashboard/spend-keys" novalidate${invalid}>
${csrfField(request, reply)}
<h2>Create a spend key</h2>
${flash.error ? html`<p class="error" role="alert" id="spend-key-error">${flash.error}</p>` : ''}
<label for="sk-name">Name</label><input id="sk-name" name="name" maxlength="255" value="${f.name ?? 'Spend key'}" required>
<label for="sk-customer">Customer id (blank: bill your own wallet)</label><input id="sk-customer" name="customer_id" value="${f.customer_id ?? ''}" placeholder="con_…">
${limitInputs(f)}
<button type="submit">Create spend key</button>
</form>`;
}

function emptyState() {
  return html`<div class="card"><h2>No spend keys yet</h2>
<p>Create one below, or with your secret key:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/spend_keys -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" -d '{"name":"Team A","spend_limit":{"amount":"50.00","cycle":"monthly"}}'</pre>
<p>Then call a provider through Tollgate with it, e.g. <code>OPENAI_BASE_URL=$TOLLGATE/v1 OPENAI_API_KEY=&lt;spend key&gt;</code>.</p></div>`;
}
