/**
 * Checkout links: a hosted checkout session made from the dashboard, in any of the API's modes,
 * through the same schema and service as POST /v1/checkout_sessions. Its URL carries a token that
 * is stored only as a hash, so the page that answers the form shows it once (with a Copy button)
 * instead of redirecting to a page that could not show it again.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AppDeps } from '../../app-deps.ts';
import { presentCheckoutSession } from '../../commerce/checkout.ts';
import { checkoutSessionCreateBody, createCheckoutSession, publicBase } from '../../services/checkout-sessions.ts';
import { listCheckoutSessions } from '../../storage/checkout-sessions.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { listPlans } from '../../storage/plans.ts';
import { customerLink } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf } from '../session.ts';
import { formSummary, formText, selectField, submit, textField, type FieldErrors, type Form, type FormSpec } from './form-fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 50;
const PATH = '/dashboard/checkout-links';

const MODES = [
  ['onboarding', 'Sign up a new customer and add credit'],
  ['topup', "Top up an existing customer's wallet"],
  ['subscription', 'Subscribe a customer to a plan'],
  ['credit_bundle', 'Buy a credit bundle of the plan a customer is on'],
] as const;
const MODE_TEXT: Record<string, string> = Object.fromEntries(MODES);

const CHECKOUT_FORM: FormSpec = {
  labels: {
    checkout_mode: 'What the customer does',
    origin_url: 'Page the customer comes from',
    customer_id: 'Customer',
    reference_id: 'Reference id for a new customer',
    plan_id: 'Plan',
    credit_bundle_id: 'Credit bundle',
  },
  // The API names its older fields in some refusals (connection_id, subscription_config_id).
  fieldOf: (path) => ({ connection_id: 'customer_id', subscription_config_id: 'plan_id' })[String(path[0])] ?? String(path[0] ?? ''),
  codeFields: { subscription_exists: 'plan_id' },
};

type Created = { url: string; id: string; mode: string; expiresAt: string };
type Flash = { form?: Form; errors?: FieldErrors; created?: Created; status?: number };

/** The form as the body POST /v1/checkout_sessions takes; blank fields are left out. */
function bodyOf(form: Form): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const field of Object.keys(CHECKOUT_FORM.labels)) if (formText(form, field)) body[field] = formText(form, field);
  return body;
}

export function registerCheckoutLinkPages(app: FastifyInstance, deps: AppDeps): void {
  const page = async (request: FastifyRequest, reply: FastifyReply, flash: Flash = {}) => {
    const merchantId = merchantOf(request);
    const [plans, sessions] = await Promise.all([listPlans(deps.storage, merchantId, undefined, 100), listCheckoutSessions(deps.storage, merchantId, undefined, LIST_LIMIT)]);
    const base = publicBase(deps.config.publicBaseUrl, request);
    const shown = sessions.slice(0, LIST_LIMIT).map((row) => presentCheckoutSession(row, null, base));
    const names = await customerNames(deps.storage, merchantId, shown.map((s) => s.customer_id).filter((id): id is string => id !== null));
    const f = flash.form ?? {};
    const errors = flash.errors;
    const planOptions = [['', '—'] as const, ...plans.map((p) => [p.id, p.name] as const)];
    const bundleOptions = [['', '—'] as const, ...plans.flatMap((p) => p.bundles.map((b) => [b.id, `${b.name} (${p.name})`] as const))];
    return sendDashboardPage(request, reply, PATH, {
      title: 'Checkout links',
      status: flash.status,
      scripts: ['/assets/forms.js'],
      main: html`<h1>Checkout links</h1>
<p>A checkout link opens Tollgate's hosted checkout for one customer, for an hour: send it, or open it from your site.</p>
${flash.created ? createdCard(flash.created) : ''}
<form class="card" method="post" action="${PATH}" novalidate>
${csrfField(request, reply)}
<h2>Create a checkout link</h2>
${formSummary(errors, 'checkout-create-error')}
${selectField({ id: 'checkout-mode', name: 'checkout_mode', label: CHECKOUT_FORM.labels.checkout_mode!, value: f.checkout_mode ?? 'onboarding', errors, options: MODES })}
${textField({ id: 'checkout-origin', name: 'origin_url', label: CHECKOUT_FORM.labels.origin_url!, value: f.origin_url ?? '', errors, type: 'url', hint: 'Your page (http or https): the customer is sent back to it, and it may frame the checkout.', extra: html` autocomplete="url"` })}
<div class="filters">
${textField({ id: 'checkout-customer', name: 'customer_id', label: CHECKOUT_FORM.labels.customer_id!, value: f.customer_id ?? '', errors, hint: 'Its id or reference id. Needed to top up or buy a bundle.', extra: html` autocomplete="off"` })}
${textField({ id: 'checkout-reference', name: 'reference_id', label: CHECKOUT_FORM.labels.reference_id!, value: f.reference_id ?? '', errors, hint: 'Optional, when the checkout signs a customer up.', extra: html` autocomplete="off"` })}
</div><div class="filters">
${selectField({ id: 'checkout-plan', name: 'plan_id', label: CHECKOUT_FORM.labels.plan_id!, value: f.plan_id ?? '', errors, options: planOptions, hint: 'For a subscription.' })}
${selectField({ id: 'checkout-bundle', name: 'credit_bundle_id', label: CHECKOUT_FORM.labels.credit_bundle_id!, value: f.credit_bundle_id ?? '', errors, options: bundleOptions, hint: 'For a bundle.' })}
</div>
<button type="submit">Create checkout link</button>
</form>
${shown.length === 0 ? '' : html`<div class="card table-wrap" tabindex="0" role="region" aria-labelledby="recent-links"><h2 id="recent-links">Recent checkout links</h2><table id="checkout-links">
<thead><tr><th scope="col">Created (UTC)</th><th scope="col">Mode</th><th scope="col">Customer</th><th scope="col">Status</th><th scope="col">Receipt</th></tr></thead>
<tbody>${shown.map(
        (s) => html`<tr id="link-${s.checkout_session_id}"><td>${s.created_at.slice(0, 16).replace('T', ' ')}</td><td>${MODE_TEXT[s.checkout_mode] ?? s.checkout_mode}</td><td>${s.customer_id ? customerLink(s.customer_id, names) : (s.reference_id ?? 'new customer')}</td>
<td>${s.completed_at ? 'completed' : s.expires_at <= new Date(deps.clock.now()).toISOString() ? 'expired' : 'open'}</td><td>${s.receipt_url ? html`<a href="${s.receipt_url}">Receipt</a>` : '—'}</td></tr>`,
      )}</tbody></table></div>`}`,
    });
  };

  app.get(PATH, (request, reply) => page(request, reply));

  app.post(PATH, async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const base = publicBase(deps.config.publicBaseUrl, request);
    const done = await submit(checkoutSessionCreateBody, bodyOf(form), CHECKOUT_FORM, (body) => createCheckoutSession(deps, merchantOf(request), body, base));
    if (!done.ok) return page(request, reply, { form, errors: done.errors, status: done.status });
    const s = done.value;
    return page(request, reply, { created: { url: s.checkout_url, id: s.checkout_session_id, mode: s.checkout_mode, expiresAt: s.expires_at }, status: 201 });
  });
}

function createdCard(c: Created) {
  return html`<div class="card notice" role="status" id="checkout-created">
<p><strong>Checkout link created</strong> (${MODE_TEXT[c.mode] ?? c.mode}). It works until ${c.expiresAt.slice(0, 16).replace('T', ' ')} UTC and is shown only now: copy it.</p>
<label for="checkout-url">Checkout URL</label>
<input id="checkout-url" readonly value="${c.url}">
<button type="button" class="secondary" data-copy="checkout-url" hidden>Copy</button> <span id="checkout-url-copied" aria-live="polite"></span>
<p class="muted">Session <code>${c.id}</code></p>
</div>`;
}
