import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../http/errors.ts';
import type { AppDeps } from '../../app-deps.ts';
import { createWebhook, listWebhookPage, presentWebhook, webhookCreateBody, webhookUrlCheck } from '../../services/webhook-endpoints.ts';
import { MAX_WEBHOOKS_PER_MERCHANT } from '../../storage/webhooks.ts';
import { html } from '../html.ts';
import { assertCsrf } from '../session.ts';
import type { FieldErrors } from './fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';
import { registerWebhookDeliveryPages } from './webhook-delivery.ts';
import { registerWebhookEndpointPages } from './webhook-endpoint.ts';
import { serviceFieldErrors, webhookBodyOf, webhookFieldErrors, webhookFields, type WebhookForm } from './webhook-form.ts';

type Webhook = ReturnType<typeof presentWebhook>;
type ListFlash = { created?: { name: string; secret: string }; message?: string; errors?: FieldErrors; form?: WebhookForm; status?: number };

/**
 * Webhook endpoints: the list and the form that adds one (its signing secret shown once). Each
 * endpoint's own page (webhook-endpoint.ts) edits, tests, rotates and deletes it, and each
 * delivery's page (webhook-delivery.ts) shows what was sent and what came back. Every change goes
 * through the same service operation as the API.
 */
export function registerWebhookPages(app: FastifyInstance, deps: AppDeps): void {
  const endpoints = { storage: deps.storage, clock: deps.clock, assertUrlAllowed: webhookUrlCheck(deps.config.webhooks.allowHttpLoopback) };

  const listPage = async (request: FastifyRequest, reply: FastifyReply, flash: ListFlash = {}) => {
    const hooks = (await listWebhookPage(deps.storage, merchantOf(request), undefined, MAX_WEBHOOKS_PER_MERCHANT)).slice(0, MAX_WEBHOOKS_PER_MERCHANT).map(presentWebhook);
    return sendDashboardPage(request, reply, '/dashboard/webhooks', {
      title: 'Webhooks',
      status: flash.status,
      main: html`<h1>Webhooks</h1>
${flash.created ? html`<div class="card notice" role="status"><p><strong>Copy the signing secret of “${flash.created.name}” now; it is not shown again.</strong></p>
<p class="secret" id="new-webhook-secret">${flash.created.secret}</p></div>` : ''}
${flash.message ? html`<p class="notice" role="status" id="webhook-message">${flash.message}</p>` : ''}
${hooks.length === 0 ? emptyState() : webhookTable(hooks)}
${hooks.length < MAX_WEBHOOKS_PER_MERCHANT ? createForm(request, reply, flash) : html`<p>You have ${MAX_WEBHOOKS_PER_MERCHANT} webhooks, the most allowed; delete one on its page to add another.</p>`}`,
    });
  };

  app.get<{ Querystring: { deleted?: string } }>('/dashboard/webhooks', (request, reply) =>
    listPage(request, reply, request.query.deleted ? { message: `Webhook “${request.query.deleted.slice(0, 255)}” deleted, with its deliveries.` } : {}),
  );

  app.post('/dashboard/webhooks', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as WebhookForm;
    const parsed = webhookCreateBody.safeParse(webhookBodyOf(form));
    if (!parsed.success) return listPage(request, reply, { errors: webhookFieldErrors(parsed.error.issues), form, status: 400 });
    try {
      const row = await createWebhook(endpoints, merchantOf(request), parsed.data);
      return listPage(request, reply, { created: { name: row.name, secret: row.secret }, status: 201 });
    } catch (e) {
      const errors = serviceFieldErrors(e);
      if (errors) return listPage(request, reply, { errors, form, status: 400 });
      if (e instanceof ApiError && e.code === 'webhook_limit_reached') return listPage(request, reply, { message: e.message, status: 409 });
      throw e;
    }
  });

  registerWebhookEndpointPages(app, deps, endpoints);
  registerWebhookDeliveryPages(app, deps);
}

function webhookTable(hooks: Webhook[]) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Webhook endpoints"><table id="webhooks">
<caption class="visually-hidden">Webhook endpoints</caption>
<thead><tr><th scope="col">Name</th><th scope="col">URL</th><th scope="col">Events</th><th scope="col">Status</th><th scope="col">Failing since</th></tr></thead>
<tbody>
${hooks.map(
  (w) => html`<tr id="webhook-${w.webhook_id}"><th scope="row"><a href="/dashboard/webhooks/${w.webhook_id}">${w.name}</a></th><td><code>${w.url}</code></td><td>${w.events.join(', ')}</td><td class="status">${w.status}</td><td>${w.failing_since ?? '—'}</td></tr>`,
)}
</tbody></table></div>`;
}

function createForm(request: FastifyRequest, reply: FastifyReply, flash: ListFlash) {
  const values = webhookBodyOf(flash.form ?? { name: 'Webhook', events: '*' });
  return html`<form class="card" method="post" action="/dashboard/webhooks" novalidate>
${csrfField(request, reply)}
<h2>Add a webhook</h2>
${webhookFields('wh', values, flash.errors ?? {})}
<button type="submit">Add webhook</button>
</form>`;
}

function emptyState() {
  return html`<div class="card"><h2>No webhooks yet</h2>
<p>A webhook tells your server when something happens (a customer created, a balance changed, a subscription renewed). Add one below, or:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/webhooks -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" -d '{"name":"Backend","url":"https://example.com/tollgate"}'</pre></div>`;
}
