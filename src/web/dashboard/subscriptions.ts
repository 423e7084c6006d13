import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { presentSubscription, type PresentedSubscription } from '../../commerce/subscription-view.ts';
import { ApiError } from '../../http/errors.ts';
import { ID_PREFIX } from '../../domain/ids.ts';
import type { AppDeps } from '../../app-deps.ts';
import { cancelAtCycleEnd } from '../../services/subscriptions.ts';
import { findSubscriptionView, listSubscriptionViews } from '../../storage/subscriptions.ts';
import { findConnection } from '../../storage/connections.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;

export function registerSubscriptionPages(app: FastifyInstance, deps: AppDeps): void {
  const subscriptionsPage = async (request: FastifyRequest, reply: FastifyReply, flash: { message?: string; status?: number } = {}) => {
    const rows = await listSubscriptionViews(deps.storage, merchantOf(request), { status: 'all', limit: LIST_LIMIT });
    const subs = rows.slice(0, LIST_LIMIT).map(presentSubscription);
    const names = await customerNames(deps.storage, merchantOf(request), subs.map((s) => s.customer_id));
    return sendDashboardPage(request, reply, '/dashboard/subscriptions', {
      title: 'Subscriptions',
      status: flash.status,
      main: html`<h1>Subscriptions</h1>
${flash.message ? html`<p class="notice" role="status" id="subscription-message">${flash.message}</p>` : ''}
${subs.length === 0 ? emptySubscriptions() : subscriptionTable(subs, { fmt: formatsFor(deps.config.currency), names })}`,
    });
  };

  app.get('/dashboard/subscriptions', (request, reply) => subscriptionsPage(request, reply));

  app.get<{ Params: { id: string } }>('/dashboard/subscriptions/:id/cancel', async (request, reply) => {
    const merchantId = merchantOf(request);
    const view = await findSubscriptionView(deps.storage.db, merchantId, request.params.id);
    if (!view) throw new WebError(404, `No subscription with id ${request.params.id}.`);
    const s = presentSubscription(view);
    const customer = await findConnection(deps.storage, merchantId, s.customer_id);
    const who = customer ? [customer.first_name, customer.last_name].filter(Boolean).join(' ') || customer.email || customer.id : s.customer_id;
    return sendConfirmPage(request, reply, '/dashboard/subscriptions', {
      question: `Cancel the ${s.plan.name} subscription of ${who}?`,
      consequence: `It ends when its current cycle does${s.cycle_end_at ? ` (${s.cycle_end_at.slice(0, 16).replace('T', ' ')} UTC)` : ''}: no renewal is charged after that, and its credit stays usable until then.`,
      action: `/dashboard/subscriptions/${encodeURIComponent(s.subscription_id)}/cancel`,
      confirmLabel: 'Cancel at cycle end',
      back: '/dashboard/subscriptions',
    });
  });

  app.post<{ Params: { id: string } }>('/dashboard/subscriptions/:id/cancel', async (request, reply) => {
    assertCsrf(request);
    try {
      await cancelAtCycleEnd(deps, merchantOf(request), request.params.id);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.code === 'subscription_cancelled') return subscriptionsPage(request, reply, { message: 'That subscription is already cancelled.', status: 409 });
      throw new WebError(404, `No subscription with id ${request.params.id}.`);
    }
    return subscriptionsPage(request, reply, { message: 'The subscription will end when its current cycle does; its credit stays usable until then.' });
  });
}

function subscriptionTable(subs: PresentedSubscription[], { fmt, names }: { fmt: Formats; names: Map<string, string> }) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Subscriptions"><table id="subscriptions">
<caption class="visually-hidden">Subscriptions, newest first</caption>
<thead><tr><th scope="col">Customer</th><th scope="col">Plan</th><th scope="col">Status</th><th scope="col">Cycle ends (UTC)</th><th scope="col" class="num">Credit left</th><th scope="col" class="num">Cycle</th><th scope="col" class="num">Bundle</th><th scope="col">Pending change</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>
${subs.map(
  (s) => html`<tr id="sub-${s.subscription_id}"><th scope="row">${customerLink(s.customer_id, names)}</th><td>${s.plan.name}</td><td class="status">${s.status}</td>
<td>${s.cycle_end_at?.slice(0, 16).replace('T', ' ') ?? '—'}</td><td class="num credit-total">${fmt.money(s.credits.total_remaining)}</td><td class="num">${fmt.money(s.credits.cycle_remaining)}</td><td class="num">${fmt.money(s.credits.bundle_remaining)}</td>
<td class="pending">${s.pending_change ? `${s.pending_change.type}${s.pending_change.effective_at ? ` at ${s.pending_change.effective_at.slice(0, 16).replace('T', ' ')}` : ''}` : '—'}</td>
<td class="actions">${cancelLink(s, names)}</td></tr>`,
)}
</tbody></table></div>`;
}

/** The Cancel step of a subscription that can still be cancelled (a confirmation page follows); nothing otherwise. */
export function cancelLink(s: PresentedSubscription, names: ReadonlyMap<string, string>) {
  if (s.status === 'cancelled' || s.pending_change?.type === 'cancellation') return '';
  return confirmLink(`/dashboard/subscriptions/${s.subscription_id}/cancel`, 'Cancel', `Cancel the subscription of ${names.get(s.customer_id) ?? s.customer_id}`, true);
}

function emptySubscriptions() {
  return html`<div class="card"><h2>No subscriptions yet</h2>
<p>Subscribe a customer to one of your <a href="/dashboard/plans">plans</a> with your secret key (or send them to a hosted checkout):</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/subscriptions -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" -d '{"customer_id":"${ID_PREFIX.connection}…","plan_id":"${ID_PREFIX.plan}…"}'</pre></div>`;
}
