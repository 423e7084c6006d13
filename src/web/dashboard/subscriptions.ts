import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { presentSubscription, type PresentedSubscription } from '../../commerce/subscription-view.ts';
import { ApiError } from '../../http/errors.ts';
import { ID_PREFIX } from '../../domain/ids.ts';
import type { AppDeps } from '../../app-deps.ts';
import { cancelAtCycleEnd, subscribeCustomer, subscriptionCreateBody } from '../../services/subscriptions.ts';
import { listConnections } from '../../storage/connections.ts';
import { listPlans } from '../../storage/plans.ts';
import { findSubscriptionView, listSubscriptionViews } from '../../storage/subscriptions.ts';
import { findConnection } from '../../storage/connections.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { formSummary, formText, selectField, submit, textField, type FieldErrors, type Form, type FormSpec } from './form-fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;

const SUBSCRIBE_FORM: FormSpec = {
  labels: { customer_id: 'Customer', plan_id: 'Plan' },
  codeFields: { subscription_exists: 'plan_id', payment_method_required: 'plan_id', payment_failed: 'plan_id' },
};

type Flash = { message?: string; status?: number; subscribe?: { form: Form; errors: FieldErrors } };

export function registerSubscriptionPages(app: FastifyInstance, deps: AppDeps): void {
  const subscriptionsPage = async (request: FastifyRequest, reply: FastifyReply, flash: Flash = {}) => {
    const rows = await listSubscriptionViews(deps.storage, merchantOf(request), { status: 'all', limit: LIST_LIMIT });
    const subs = rows.slice(0, LIST_LIMIT).map(presentSubscription);
    const names = await customerNames(deps.storage, merchantOf(request), subs.map((s) => s.customer_id));
    return sendDashboardPage(request, reply, '/dashboard/subscriptions', {
      title: 'Subscriptions',
      status: flash.status,
      main: html`<h1>Subscriptions</h1>
${flash.message ? html`<p class="notice" role="status" id="subscription-message">${flash.message}</p>` : ''}
${subs.length === 0 ? emptySubscriptions() : subscriptionTable(subs, { fmt: formatsFor(deps.config.currency), names })}
${await subscribeForm(deps, request, reply, flash.subscribe)}`,
    });
  };

  app.get<{ Querystring: { started?: string; changed?: string } }>('/dashboard/subscriptions', (request, reply) => {
    const { started, changed } = request.query;
    const message = started ? 'Subscription started.' : changed ? "The customer's subscription changes plan (see Pending change for a change at the cycle end)." : undefined;
    return subscriptionsPage(request, reply, message ? { message } : {});
  });

  app.post('/dashboard/subscriptions', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const body = { customer_id: formText(form, 'customer_id'), plan_id: formText(form, 'plan_id') };
    const done = await submit(subscriptionCreateBody, body, SUBSCRIBE_FORM, (data) => subscribeCustomer(deps, merchantOf(request), data));
    if (!done.ok) return subscriptionsPage(request, reply, { subscribe: { form, errors: done.errors }, status: done.status });
    return reply.redirect(`/dashboard/subscriptions?${done.value.created ? 'started' : 'changed'}=${encodeURIComponent(done.value.subscription.subscription_id)}`, 303);
  });

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

/**
 * Subscribe a customer, as POST /v1/subscriptions: a free plan starts at once, a paid one is
 * charged to the customer's saved payment method (without one, a subscription checkout link is
 * the way). The customer is typed (id or reference), with the newest customers offered.
 */
async function subscribeForm(deps: AppDeps, request: FastifyRequest, reply: FastifyReply, state: Flash['subscribe']) {
  const merchantId = merchantOf(request);
  const [plans, customers] = await Promise.all([listPlans(deps.storage, merchantId, undefined, LIST_LIMIT), listConnections(deps.storage, merchantId, { limit: LIST_LIMIT })]);
  const f = state?.form ?? {};
  const errors = state?.errors;
  return html`<form class="card" method="post" action="/dashboard/subscriptions" novalidate>
${csrfField(request, reply)}
<h2>Subscribe a customer</h2>
${plans.length === 0 ? html`<p>Create a <a href="/dashboard/plans">plan</a> first.</p>` : ''}
${formSummary(errors, 'subscribe-error')}
<div class="filters">
${textField({ id: 'subscribe-customer', name: 'customer_id', label: 'Customer', value: f.customer_id ?? '', errors, hint: 'Its id or reference id.', extra: html` list="subscribe-customers" autocomplete="off"` })}
${selectField({ id: 'subscribe-plan', name: 'plan_id', label: 'Plan', value: f.plan_id ?? '', errors, options: [['', '—'], ...plans.slice(0, LIST_LIMIT).map((p) => [p.id, p.name] as const)] })}
</div>
<datalist id="subscribe-customers">${customers.slice(0, LIST_LIMIT).map((c) => html`<option value="${c.id}">${[c.first_name, c.last_name].filter(Boolean).join(' ') || c.email || c.reference_id || c.id}</option>`)}</datalist>
<p class="muted">A paid plan is charged now to the customer's saved card; a customer without one subscribes through a <a href="/dashboard/checkout-links">checkout link</a>. A subscribed customer changes plan instead (an upgrade now, a downgrade at the cycle end).</p>
<button type="submit">Subscribe</button>
</form>`;
}

function emptySubscriptions() {
  return html`<div class="card"><h2>No subscriptions yet</h2>
<p>Subscribe a customer to one of your <a href="/dashboard/plans">plans</a> with your secret key (or send them to a hosted checkout):</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/subscriptions -H "Authorization: Bearer sk_live_…" \\
  -H "Content-Type: application/json" -d '{"customer_id":"${ID_PREFIX.connection}…","plan_id":"${ID_PREFIX.plan}…"}'</pre></div>`;
}
