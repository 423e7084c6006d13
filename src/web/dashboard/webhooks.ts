import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { nowOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { chosenEvents, presentDelivery, presentWebhook, webhookCreateBody } from '../../services/webhook-endpoints.ts';
import { findWebhook, insertWebhook, listDeliveries, listWebhooks, MAX_WEBHOOKS_PER_MERCHANT, redeliver, type WebhookRow } from '../../storage/webhooks.ts';
import { systemResolver, urlProblemAfterLookup } from '../../webhooks/url-safety.ts';
import { plainIssues } from '../form-issues.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const DELIVERIES_PER_PAGE = 25;

type Form = Record<string, string>;
type ListFlash = { created?: { name: string; secret: string }; error?: string; form?: Form; status?: number };

export function registerWebhookPages(app: FastifyInstance, deps: AppDeps): void {
  const policy = { allowHttpLoopback: deps.config.webhooks.allowHttpLoopback };

  const listPage = async (request: FastifyRequest, reply: FastifyReply, flash: ListFlash = {}) => {
    const hooks = (await listWebhooks(deps.storage, merchantOf(request), undefined, MAX_WEBHOOKS_PER_MERCHANT)).slice(0, MAX_WEBHOOKS_PER_MERCHANT);
    return sendDashboardPage(request, reply, '/dashboard/webhooks', {
      title: 'Webhooks',
      status: flash.status,
      main: html`<h1>Webhooks</h1>
${flash.created ? html`<div class="card notice" role="status"><p><strong>Copy the signing secret of “${flash.created.name}” now; it is not shown again.</strong></p>
<p class="secret" id="new-webhook-secret">${flash.created.secret}</p></div>` : ''}
${hooks.length === 0 ? emptyState() : webhookTable(hooks)}
${hooks.length < MAX_WEBHOOKS_PER_MERCHANT ? createForm(request, reply, flash) : html`<p>You have ${MAX_WEBHOOKS_PER_MERCHANT} webhooks, the most allowed; delete one with the API to add another.</p>`}`,
    });
  };

  app.get('/dashboard/webhooks', (request, reply) => listPage(request, reply));

  app.post('/dashboard/webhooks', async (request, reply) => {
    assertCsrf(request);
    const merchantId = merchantOf(request);
    const form = (request.body ?? {}) as Form;
    const parsed = webhookCreateBody.safeParse({ name: (form.name ?? '').trim() || 'Webhook', url: (form.url ?? '').trim() });
    if (!parsed.success) {
      const error = plainIssues(parsed.error.issues, (path) => (path[0] === 'url' ? 'URL' : 'Name'));
      return listPage(request, reply, { error, form, status: 400 });
    }
    // The same address check as POST /v1/webhooks: no private or loopback targets unless allowed.
    const problem = await urlProblemAfterLookup(parsed.data.url, policy, systemResolver);
    if (problem) return listPage(request, reply, { error: `URL: the webhook url ${problem}.`, form, status: 400 });
    const at = new Date(nowOf(deps)).toISOString();
    const row = await insertWebhook(deps.storage, merchantId, { name: parsed.data.name, url: parsed.data.url, events: chosenEvents(undefined) }, at);
    if (row === 'limit_reached') return listPage(request, reply, { error: `You already have ${MAX_WEBHOOKS_PER_MERCHANT} webhooks.`, form, status: 409 });
    return listPage(request, reply, { created: { name: row.name, secret: row.secret }, status: 201 });
  });

  app.get<{ Params: { id: string }; Querystring: { cursor?: string; redelivered?: string } }>('/dashboard/webhooks/:id', async (request, reply) => {
    const hook = await webhookOf(deps, request);
    const cursor = request.query.cursor || undefined;
    const rows = await listDeliveries(deps.storage, hook.id, cursor, DELIVERIES_PER_PAGE);
    const page = rows.slice(0, DELIVERIES_PER_PAGE).map(presentDelivery);
    const next = rows.length > DELIVERIES_PER_PAGE ? page[page.length - 1]!.delivery_id : null;
    const w = presentWebhook(hook);
    const redelivered = request.query.redelivered;
    return sendDashboardPage(request, reply, '/dashboard/webhooks', {
      title: `Webhook ${w.name}`,
      main: html`<h1>Webhook ${w.name}</h1>
${redelivered ? html`<p class="notice" role="status" id="redeliver-notice">Delivery <code>${redelivered}</code> is scheduled to be sent again now.</p>` : ''}
<div class="card"><dl class="kv"><dt>URL</dt><dd><code>${w.url}</code></dd><dt>Events</dt><dd>${w.events.join(', ')}</dd>
<dt>Status</dt><dd>${w.status}${w.disabled_at ? html` since ${w.disabled_at}` : ''}</dd><dt>Failing since</dt><dd>${w.failing_since ?? '—'}</dd>
<dt>Created</dt><dd>${w.created_at}</dd></dl></div>
<div class="card"><h2 id="deliveries-title">Deliveries</h2>
${page.length === 0 && !cursor ? html`<p>No deliveries yet. Events are sent here as they happen: create a customer or record a request to see the first one.</p>` : deliveryTable(request, reply, hook.id, page)}
${next ? html`<p><a class="button secondary" rel="next" href="/dashboard/webhooks/${hook.id}?cursor=${encodeURIComponent(next)}">Older deliveries</a></p>` : ''}
</div>
<p><a href="/dashboard/webhooks">All webhooks</a></p>`,
    });
  });

  app.post<{ Params: { id: string; delivery: string } }>('/dashboard/webhooks/:id/deliveries/:delivery/redeliver', async (request, reply) => {
    assertCsrf(request);
    const hook = await webhookOf(deps, request);
    const row = await redeliver(deps.storage, hook.id, request.params.delivery, new Date(nowOf(deps)).toISOString());
    if (!row) throw new WebError(404, `No delivery with id ${request.params.delivery}.`);
    return reply.redirect(`/dashboard/webhooks/${encodeURIComponent(hook.id)}?redelivered=${encodeURIComponent(row.id)}`, 303);
  });
}

async function webhookOf(deps: AppDeps, request: FastifyRequest<{ Params: { id: string } }>): Promise<WebhookRow> {
  const hook = await findWebhook(deps.storage, merchantOf(request), request.params.id);
  if (!hook) throw new WebError(404, `No webhook with id ${request.params.id}.`);
  return hook;
}

function webhookTable(hooks: WebhookRow[]) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Webhook endpoints"><table id="webhooks">
<caption class="visually-hidden">Webhook endpoints</caption>
<thead><tr><th scope="col">Name</th><th scope="col">URL</th><th scope="col">Events</th><th scope="col">Status</th><th scope="col">Failing since</th></tr></thead>
<tbody>
${hooks.map(presentWebhook).map(
  (w) => html`<tr><th scope="row"><a href="/dashboard/webhooks/${w.webhook_id}">${w.name}</a></th><td><code>${w.url}</code></td><td>${w.events.join(', ')}</td><td>${w.status}</td><td>${w.failing_since ?? '—'}</td></tr>`,
)}
</tbody></table></div>`;
}

function deliveryTable(request: FastifyRequest, reply: FastifyReply, webhookId: string, rows: ReturnType<typeof presentDelivery>[]) {
  return html`<div class="table-wrap" tabindex="0" role="region" aria-labelledby="deliveries-title"><table id="deliveries" aria-labelledby="deliveries-title">
<thead><tr><th scope="col">Event</th><th scope="col">State</th><th scope="col" class="num">Attempts</th><th scope="col">Last answer</th><th scope="col">Last attempt (UTC)</th><th scope="col">Next attempt (UTC)</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>
${rows.map(
  (d) => html`<tr id="delivery-${d.delivery_id}"><th scope="row">${d.event} <span class="muted">${d.event_id}</span></th><td class="state">${d.state}</td><td class="num attempts">${d.attempts}</td>
<td>${d.last_status_code ?? d.last_error ?? '—'}</td><td>${d.last_attempt_at?.slice(0, 19).replace('T', ' ') ?? '—'}</td><td>${d.next_attempt_at?.slice(0, 19).replace('T', ' ') ?? '—'}</td>
<td><form method="post" action="/dashboard/webhooks/${webhookId}/deliveries/${d.delivery_id}/redeliver">${csrfField(request, reply)}<button class="secondary" type="submit" aria-label="Redeliver ${d.event} ${d.delivery_id}">Redeliver</button></form></td></tr>`,
)}
</tbody></table></div>`;
}

function createForm(request: FastifyRequest, reply: FastifyReply, flash: ListFlash) {
  const f = flash.form ?? {};
  return html`<form class="card" method="post" action="/dashboard/webhooks" novalidate>
${csrfField(request, reply)}
<h2>Add a webhook</h2>
${flash.error ? html`<p class="error" role="alert" id="webhook-error">${flash.error}</p>` : ''}
<label for="wh-name">Name</label><input id="wh-name" name="name" maxlength="255" value="${f.name ?? 'Webhook'}" required>
<label for="wh-url">URL (https)</label><input id="wh-url" name="url" type="url" maxlength="2048" value="${f.url ?? ''}" placeholder="https://example.com/tollgate" required${flash.error ? html` aria-invalid="true" aria-describedby="webhook-error"` : ''}>
<p class="muted">Receives every event; choose events with <code>PATCH /v1/webhooks/{id}</code>.</p>
<button type="submit">Add webhook</button>
</form>`;
}

function emptyState() {
  return html`<div class="card"><h2>No webhooks yet</h2>
<p>A webhook tells your server when something happens (a customer created, a balance changed, a subscription renewed). Add one below, or:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/webhooks -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" -d '{"name":"Backend","url":"https://example.com/tollgate"}'</pre></div>`;
}
