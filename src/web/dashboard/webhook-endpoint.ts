import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../http/errors.ts';
import type { AppDeps } from '../../app-deps.ts';
import {
  changeWebhook,
  getWebhook,
  listDeliveryPage,
  presentDelivery,
  presentWebhook,
  removeWebhook,
  rotateSecret,
  sendTestEvent,
  webhookUpdateBody,
  type WebhookEndpointDeps,
} from '../../services/webhook-endpoints.ts';
import type { WebhookRow } from '../../storage/webhooks.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import type { FieldErrors } from './fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';
import { deliveryTable } from './webhook-delivery.ts';
import { serviceFieldErrors, webhookBodyOf, webhookFieldErrors, webhookFields, type WebhookForm } from './webhook-form.ts';

const DELIVERIES_PER_PAGE = 25;
/** How long a rotated-out secret keeps signing beside the new one (the API's default). */
const ROTATION_OVERLAP_SECONDS = 24 * 3600;

type Params = { Params: { id: string } };
type PageQuery = { cursor?: string; redelivered?: string; tested?: string; saved?: string; status?: string };
type Flash = { secret?: string; errors?: FieldErrors; form?: WebhookForm; status?: number; message?: string };

const NOTICES: Record<string, string> = { saved: 'Changes saved.', enabled: 'Webhook enabled: deliveries are sent again.', disabled: 'Webhook disabled: nothing is sent until you enable it.' };

/**
 * One webhook endpoint's page: its settings and the form that edits them (URL, name, events),
 * Send test event, Enable or Disable, Rotate secret and Delete (those two asked first), and its
 * deliveries, newest first, each linking to what was sent and what came back.
 */
export function registerWebhookEndpointPages(app: FastifyInstance, deps: AppDeps, endpoints: WebhookEndpointDeps): void {
  const hookOf = async (request: FastifyRequest<Params>): Promise<WebhookRow> => {
    try {
      return await getWebhook(deps.storage, merchantOf(request), request.params.id);
    } catch (e) {
      if (e instanceof ApiError && e.code === 'not_found') throw new WebError(404, `No webhook with id ${request.params.id}.`);
      throw e;
    }
  };
  const back = (id: string, query: string) => `/dashboard/webhooks/${encodeURIComponent(id)}?${query}`;

  const endpointPage = async (request: FastifyRequest<Params>, reply: FastifyReply, flash: Flash = {}) => {
    const hook = await hookOf(request);
    const q = request.query as PageQuery;
    const cursor = q.cursor || undefined;
    const rows = await listDeliveryPage(deps.storage, merchantOf(request), hook.id, cursor, DELIVERIES_PER_PAGE).catch((e: unknown) => {
      if (e instanceof ApiError && e.code === 'invalid_cursor') throw new WebError(400, 'That page of deliveries does not exist.');
      throw e;
    });
    const page = rows.slice(0, DELIVERIES_PER_PAGE).map(presentDelivery);
    const next = rows.length > DELIVERIES_PER_PAGE ? page[page.length - 1]!.delivery_id : null;
    const w = presentWebhook(hook);
    const notice = flash.message ?? (q.status ? NOTICES[q.status] : undefined);
    return sendDashboardPage(request, reply, '/dashboard/webhooks', {
      title: `Webhook ${w.name}`,
      status: flash.status,
      main: html`<h1>Webhook ${w.name}</h1>
${flash.secret ? html`<div class="card notice" role="status"><p><strong>Copy the new signing secret now; it is not shown again.</strong> The old one keeps signing beside it until ${w.previous_secret_expires_at ?? ''} (UTC), so your receiver can switch without refusing deliveries.</p>
<p class="secret" id="new-webhook-secret">${flash.secret}</p></div>` : ''}
${q.redelivered ? html`<p class="notice" role="status" id="redeliver-notice">Delivery <code>${q.redelivered}</code> is scheduled to be sent again now.</p>` : ''}
${q.tested ? html`<p class="notice" role="status" id="test-notice">A test event is on its way: <a href="/dashboard/webhooks/${w.webhook_id}/deliveries/${q.tested}">see its delivery</a>.</p>` : ''}
${notice ? html`<p class="notice" role="status" id="webhook-notice">${notice}</p>` : ''}
<div class="card"><dl class="kv"><dt>URL</dt><dd><code>${w.url}</code></dd><dt>Events</dt><dd>${w.events.join(', ')}</dd>
<dt>Status</dt><dd id="webhook-status">${w.status}${w.disabled_at ? html` since ${w.disabled_at}` : ''}</dd><dt>Failing since</dt><dd>${w.failing_since ?? '—'}</dd>
${w.previous_secret_expires_at ? html`<dt>Previous secret signs until</dt><dd>${w.previous_secret_expires_at}</dd>` : ''}
<dt>Created</dt><dd>${w.created_at}</dd></dl>
<div class="actions">
${w.status === 'enabled' ? actionButton(request, reply, `/dashboard/webhooks/${w.webhook_id}/test`, 'Send test event') : ''}
${actionButton(request, reply, `/dashboard/webhooks/${w.webhook_id}/${w.status === 'enabled' ? 'disable' : 'enable'}`, w.status === 'enabled' ? 'Disable' : 'Enable', true)}
${confirmLink(`/dashboard/webhooks/${w.webhook_id}/rotate`, 'Rotate secret', `Rotate secret of ${w.name}`)}
${confirmLink(`/dashboard/webhooks/${w.webhook_id}/delete`, 'Delete', `Delete the webhook ${w.name}`, true)}
</div></div>
<form class="card" method="post" action="/dashboard/webhooks/${w.webhook_id}" novalidate>
${csrfField(request, reply)}
<h2>Edit</h2>
${webhookFields('edit', flash.form ? webhookBodyOf(flash.form) : w, flash.errors ?? {})}
<button type="submit">Save changes</button>
</form>
<div class="card"><h2 id="deliveries-title">Deliveries</h2>
${page.length === 0 && !cursor ? html`<p>No deliveries yet. Send a test event, or wait for the next event (create a customer or record a request).</p>` : deliveryTable(request, reply, hook.id, page)}
${next ? html`<p><a class="button secondary" rel="next" href="/dashboard/webhooks/${hook.id}?cursor=${encodeURIComponent(next)}">Older deliveries</a></p>` : ''}
</div>
<p><a href="/dashboard/webhooks">All webhooks</a></p>`,
    });
  };

  app.get<Params>('/dashboard/webhooks/:id', (request, reply) => endpointPage(request, reply));

  app.post<Params>('/dashboard/webhooks/:id', async (request, reply) => {
    assertCsrf(request);
    const hook = await hookOf(request);
    const form = (request.body ?? {}) as WebhookForm;
    const parsed = webhookUpdateBody.safeParse(webhookBodyOf(form));
    if (!parsed.success) return endpointPage(request, reply, { errors: webhookFieldErrors(parsed.error.issues), form, status: 400 });
    try {
      await changeWebhook(endpoints, merchantOf(request), hook.id, parsed.data);
    } catch (e) {
      const errors = serviceFieldErrors(e);
      if (errors) return endpointPage(request, reply, { errors, form, status: 400 });
      throw e;
    }
    return reply.redirect(back(hook.id, 'status=saved'), 303);
  });

  for (const [action, enabled] of [['enable', true], ['disable', false]] as const) {
    app.post<Params>(`/dashboard/webhooks/:id/${action}`, async (request, reply) => {
      assertCsrf(request);
      const hook = await hookOf(request);
      await changeWebhook(endpoints, merchantOf(request), hook.id, { enabled });
      return reply.redirect(back(hook.id, `status=${action}d`), 303);
    });
  }

  app.post<Params>('/dashboard/webhooks/:id/test', async (request, reply) => {
    assertCsrf(request);
    const hook = await hookOf(request);
    try {
      const delivery = await sendTestEvent(endpoints, merchantOf(request), hook.id);
      return reply.redirect(back(hook.id, `tested=${encodeURIComponent(delivery.id)}`), 303);
    } catch (e) {
      if (e instanceof ApiError && e.code === 'conflict') return endpointPage(request, reply, { message: e.message, status: 409 });
      throw e;
    }
  });

  app.get<Params>('/dashboard/webhooks/:id/rotate', async (request, reply) => {
    const w = presentWebhook(await hookOf(request));
    return sendConfirmPage(request, reply, '/dashboard/webhooks', {
      question: `Rotate the signing secret of ${w.name}?`,
      consequence: 'A new secret signs every delivery from now on and is shown once on the next page. For one day the old secret signs beside it, so your receiver keeps accepting deliveries while you switch it to the new one.',
      action: `/dashboard/webhooks/${encodeURIComponent(w.webhook_id)}/rotate`,
      confirmLabel: 'Rotate the secret',
      back: `/dashboard/webhooks/${w.webhook_id}`,
    });
  });

  app.post<Params>('/dashboard/webhooks/:id/rotate', async (request, reply) => {
    assertCsrf(request);
    const hook = await hookOf(request);
    const row = await rotateSecret(endpoints, merchantOf(request), hook.id, ROTATION_OVERLAP_SECONDS);
    return endpointPage(request, reply, { secret: row.secret });
  });

  app.get<Params>('/dashboard/webhooks/:id/delete', async (request, reply) => {
    const w = presentWebhook(await hookOf(request));
    return sendConfirmPage(request, reply, '/dashboard/webhooks', {
      question: `Delete the webhook ${w.name}?`,
      consequence: html`Nothing more is sent to <code>${w.url}</code>, and its delivery history is deleted with it. This cannot be undone; to stop deliveries for a while, disable it instead.`,
      action: `/dashboard/webhooks/${encodeURIComponent(w.webhook_id)}/delete`,
      confirmLabel: 'Delete the webhook',
      back: `/dashboard/webhooks/${w.webhook_id}`,
    });
  });

  app.post<Params>('/dashboard/webhooks/:id/delete', async (request, reply) => {
    assertCsrf(request);
    const hook = await hookOf(request);
    await removeWebhook(deps.storage, merchantOf(request), hook.id);
    return reply.redirect(`/dashboard/webhooks?deleted=${encodeURIComponent(hook.name)}`, 303);
  });
}

/** A one-click action (nothing lost by it): a form with the CSRF token and one button. */
function actionButton(request: FastifyRequest, reply: FastifyReply, action: string, label: string, secondary = false) {
  return html`<form method="post" action="${action}">${csrfField(request, reply)}<button${secondary ? html` class="secondary"` : ''} type="submit">${label}</button></form>`;
}
