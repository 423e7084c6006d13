import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../http/errors.ts';
import type { AppDeps } from '../../app-deps.ts';
import { getDelivery, presentDelivery, redeliverDelivery } from '../../services/webhook-endpoints.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

type Delivery = ReturnType<typeof presentDelivery>;
type Params = { Params: { id: string; delivery: string } };

const time = (iso: string | null) => iso?.slice(0, 19).replace('T', ' ') ?? '—';

/** The 404 page for a webhook or delivery this merchant does not have. */
function pageNotFound(e: unknown, what: string): never {
  if (e instanceof ApiError && e.code === 'not_found') throw new WebError(404, `No ${what}.`);
  throw e;
}

/**
 * One delivery: the body it sends (every attempt sends the same bytes, signed), and what its last
 * attempt got back (status or error, the start of the answer, how long it took), with Redeliver.
 */
export function registerWebhookDeliveryPages(app: FastifyInstance, deps: AppDeps): void {
  app.get<Params>('/dashboard/webhooks/:id/deliveries/:delivery', async (request, reply) => {
    const d = await getDelivery(deps.storage, merchantOf(request), request.params.id, request.params.delivery).catch((e: unknown) => pageNotFound(e, `delivery with id ${request.params.delivery}`));
    const redelivered = (request.query as { redelivered?: string }).redelivered;
    return sendDashboardPage(request, reply, '/dashboard/webhooks', {
      title: `Delivery of ${d.event}`,
      main: html`<h1>Delivery of <code>${d.event}</code></h1>
${redelivered ? html`<p class="notice" role="status" id="redeliver-notice">Scheduled to be sent again now.</p>` : ''}
<div class="card"><dl class="kv" id="delivery-summary"><dt>Event id</dt><dd><code>${d.event_id}</code></dd><dt>State</dt><dd id="delivery-state">${d.state}</dd><dt>Attempts</dt><dd>${d.attempts}</dd>
<dt>Created (UTC)</dt><dd>${time(d.created_at)}</dd><dt>Last attempt (UTC)</dt><dd>${time(d.last_attempt_at)}</dd><dt>Next attempt (UTC)</dt><dd>${time(d.next_attempt_at)}</dd></dl>
${redeliverForm(request, reply, d, `/dashboard/webhooks/${d.webhook_id}/deliveries/${d.delivery_id}/redeliver?back=delivery`)}</div>
<div class="card"><h2>Response to the last attempt</h2>
${d.last_attempt_at === null ? html`<p>Not sent yet.</p>` : html`<dl class="kv" id="delivery-response"><dt>Status</dt><dd id="response-status">${d.last_status_code ?? html`no answer (<code>${d.last_error ?? 'unknown'}</code>)`}</dd>
<dt>Took</dt><dd id="response-time">${d.last_duration_ms === null ? '—' : `${d.last_duration_ms} ms`}</dd></dl>
<h3>Body (first 1 KiB)</h3>${d.last_response_body ? html`<pre class="secret" id="response-body">${d.last_response_body}</pre>` : html`<p class="muted" id="response-body">Empty.</p>`}`}
</div>
<div class="card"><h2>Payload</h2><p class="muted">Every attempt sends these bytes, signed with the webhook's secret.</p>
<pre class="secret" id="delivery-payload">${pretty(d.request_body)}</pre></div>
<p><a href="/dashboard/webhooks/${d.webhook_id}">Back to the webhook</a></p>`,
    });
  });

  app.post<Params & { Querystring: { back?: string } }>('/dashboard/webhooks/:id/deliveries/:delivery/redeliver', async (request, reply) => {
    assertCsrf(request);
    const row = await redeliverDelivery(deps, merchantOf(request), request.params.id, request.params.delivery).catch((e: unknown) => pageNotFound(e, `delivery with id ${request.params.delivery}`));
    const hook = encodeURIComponent(row.webhook_id);
    const target = request.query.back === 'delivery' ? `/dashboard/webhooks/${hook}/deliveries/${encodeURIComponent(row.id)}?redelivered=1` : `/dashboard/webhooks/${hook}?redelivered=${encodeURIComponent(row.id)}`;
    return reply.redirect(target, 303);
  });
}

/** The payload indented for reading; a body that is somehow not JSON is shown as it is. */
function pretty(body: string): string {
  try {
    return JSON.stringify(JSON.parse(body), null, 2);
  } catch {
    return body;
  }
}

function redeliverForm(request: FastifyRequest, reply: FastifyReply, d: Delivery, action: string) {
  return html`<form method="post" action="${action}">${csrfField(request, reply)}<button class="secondary" type="submit" aria-label="Redeliver ${d.event} ${d.delivery_id}">Redeliver</button></form>`;
}

/** A webhook's deliveries: each event links to its delivery's page; Redeliver sends it again now. */
export function deliveryTable(request: FastifyRequest, reply: FastifyReply, webhookId: string, rows: Delivery[]) {
  return html`<div class="table-wrap" tabindex="0" role="region" aria-labelledby="deliveries-title"><table id="deliveries" aria-labelledby="deliveries-title">
<thead><tr><th scope="col">Event</th><th scope="col">State</th><th scope="col" class="num">Attempts</th><th scope="col">Last answer</th><th scope="col">Last attempt (UTC)</th><th scope="col">Next attempt (UTC)</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>
${rows.map(
  (d) => html`<tr id="delivery-${d.delivery_id}"><th scope="row"><a href="/dashboard/webhooks/${webhookId}/deliveries/${d.delivery_id}">${d.event}</a> <span class="muted">${d.event_id}</span></th><td class="state">${d.state}</td><td class="num attempts">${d.attempts}</td>
<td>${d.last_status_code ?? d.last_error ?? '—'}${d.last_duration_ms === null ? '' : html` <span class="muted">(${d.last_duration_ms} ms)</span>`}</td><td>${time(d.last_attempt_at)}</td><td>${time(d.next_attempt_at)}</td>
<td class="actions">${redeliverForm(request, reply, d, `/dashboard/webhooks/${webhookId}/deliveries/${d.delivery_id}/redeliver`)}</td></tr>`,
)}
</tbody></table></div>`;
}
