import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../http/errors.ts';
import { nowIsoOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { BILLING_INTERVALS, createPlan, planCreateBody, presentPlan, ROLLOVER_TYPES } from '../../services/plans.ts';
import { listPlans } from '../../storage/plans.ts';
import { plainIssues } from '../form-issues.ts';
import { formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf } from '../session.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;

type Form = Record<string, string>;
type Plan = ReturnType<typeof presentPlan>;
type PlanFlash = { message?: string; error?: string; form?: Form; status?: number };

const FIELD_LABELS: Record<string, string> = {
  name: 'Name',
  period_amount: 'Price per period',
  included_credit: 'Credit included each period',
  billing_interval: 'Billing interval',
  rollover_type: 'Unused credit',
  credit_bundles: 'Credit bundle',
};

const text = (form: Form, name: string) => (form[name] ?? '').trim();

/** The form as the body POST /v1/plans takes; an optional single credit bundle. */
function bodyOf(form: Form): Record<string, unknown> {
  const body: Record<string, unknown> = {
    name: text(form, 'name'),
    period_amount: text(form, 'period_amount'),
    billing_interval: text(form, 'billing_interval'),
    rollover_type: text(form, 'rollover_type') || 'full',
  };
  if (text(form, 'included_credit')) body.included_credit = text(form, 'included_credit');
  if (text(form, 'bundle_name') || text(form, 'bundle_cost') || text(form, 'bundle_credit')) {
    body.credit_bundles = [{ name: text(form, 'bundle_name'), cost: text(form, 'bundle_cost'), credit_amount: text(form, 'bundle_credit') }];
  }
  return body;
}

const BUNDLE_FIELD_LABELS: Record<string, string> = { name: 'Bundle name', cost: 'Bundle price', credit_amount: 'Bundle credit' };

const issueText = (issues: Parameters<typeof plainIssues>[0]) =>
  plainIssues(issues, (path) =>
    path[0] === 'credit_bundles'
      ? (BUNDLE_FIELD_LABELS[String(path[2] ?? '')] ?? FIELD_LABELS.credit_bundles!)
      : (FIELD_LABELS[String(path[0])] ?? String(path[0] ?? 'Form')),
  );

export function registerPlanPages(app: FastifyInstance, deps: AppDeps): void {
  const plansPage = async (request: FastifyRequest, reply: FastifyReply, flash: PlanFlash = {}) => {
    const plans = (await listPlans(deps.storage, merchantOf(request), undefined, LIST_LIMIT)).slice(0, LIST_LIMIT).map(presentPlan);
    return sendDashboardPage(request, reply, '/dashboard/plans', {
      title: 'Plans',
      status: flash.status,
      main: html`<h1>Plans</h1>
${flash.message ? html`<p class="notice" role="status" id="plan-message">${flash.message}</p>` : ''}
${plans.length === 0 ? emptyPlans() : plans.map((p) => planCard(p, formatsFor(deps.config.currency)))}
${planForm(request, reply, flash)}`,
    });
  };

  app.get('/dashboard/plans', (request, reply) => plansPage(request, reply));

  app.post('/dashboard/plans', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const parsed = planCreateBody.safeParse(bodyOf(form));
    if (!parsed.success) return plansPage(request, reply, { error: issueText(parsed.error.issues), form, status: 400 });
    try {
      const plan = await createPlan(deps.storage, merchantOf(request), parsed.data, nowIsoOf(deps));
      return plansPage(request, reply, { message: `Plan “${plan.name}” created.`, status: 201 });
    } catch (e) {
      if (e instanceof ApiError && e.issues) return plansPage(request, reply, { error: issueText(e.issues), form, status: 400 });
      throw e;
    }
  });
}

function planCard(p: Plan, fmt: Formats) {
  return html`<div class="card plan" id="plan-${p.plan_id}"><h2>${p.name}</h2>
<dl class="kv"><dt>Price</dt><dd>${fmt.money(p.period_amount)} per ${p.billing_interval}</dd><dt>Credit included</dt><dd>${fmt.money(p.included_credit)}</dd>
<dt>Unused credit</dt><dd>${p.rollover_type === 'full' ? 'rolls over' : 'expires at cycle end'}</dd><dt>Plan id</dt><dd><code>${p.plan_id}</code></dd>
<dt>Meters</dt><dd>${p.linked_meters.length === 0 ? 'all' : p.linked_meters.map((m) => m.name).join(', ')}</dd></dl>
${p.credit_bundles.length === 0 ? html`<p class="muted">No credit bundles.</p>` : html`<div class="table-wrap" tabindex="0" role="region" aria-label="Credit bundles of ${p.name}"><table><caption>Credit bundles of ${p.name}</caption>
<thead><tr><th scope="col">Bundle</th><th scope="col" class="num">Price</th><th scope="col" class="num">Credit</th></tr></thead>
<tbody>${p.credit_bundles.map((b) => html`<tr><th scope="row">${b.name}</th><td class="num">${fmt.money(b.cost)}</td><td class="num">${fmt.money(b.credit_amount)}</td></tr>`)}</tbody></table></div>`}
</div>`;
}

function select(id: string, name: string, options: readonly string[], selected: string | undefined) {
  return html`<select id="${id}" name="${name}">${options.map((o) => html`<option${o === selected ? html` selected` : ''}>${o}</option>`)}</select>`;
}

function planForm(request: FastifyRequest, reply: FastifyReply, flash: PlanFlash) {
  const f = flash.form ?? {};
  return html`<form class="card" method="post" action="/dashboard/plans" novalidate>
${csrfField(request, reply)}
<h2>Create a plan</h2>
${flash.error ? html`<p class="error" role="alert" id="plan-error">${flash.error}</p>` : ''}
<label for="plan-name">Name</label><input id="plan-name" name="name" maxlength="255" value="${f.name ?? ''}" required>
<div class="filters">
<div><label for="plan-price">Price per period</label><input id="plan-price" name="period_amount" inputmode="decimal" value="${f.period_amount ?? ''}" placeholder="20.00" required></div>
<div><label for="plan-interval">Billing interval</label>${select('plan-interval', 'billing_interval', BILLING_INTERVALS, f.billing_interval ?? 'month')}</div>
</div><div class="filters">
<div><label for="plan-credit">Credit included each period (blank: the price)</label><input id="plan-credit" name="included_credit" inputmode="decimal" value="${f.included_credit ?? ''}"></div>
<div><label for="plan-rollover">Unused credit</label>${select('plan-rollover', 'rollover_type', ROLLOVER_TYPES, f.rollover_type ?? 'full')}</div>
</div>
<fieldset><legend>Credit bundle customers can buy (optional)</legend>
<div class="filters">
<div><label for="bundle-name">Bundle name</label><input id="bundle-name" name="bundle_name" maxlength="255" value="${f.bundle_name ?? ''}"></div>
<div><label for="bundle-cost">Bundle price</label><input id="bundle-cost" name="bundle_cost" inputmode="decimal" value="${f.bundle_cost ?? ''}"></div>
<div><label for="bundle-credit">Bundle credit</label><input id="bundle-credit" name="bundle_credit" inputmode="decimal" value="${f.bundle_credit ?? ''}"></div>
</div></fieldset>
<button type="submit">Create plan</button>
</form>`;
}

function emptyPlans() {
  return html`<div class="card"><h2>No plans yet</h2><p>A plan is a subscription you sell: a price per period that includes credit, and bundles of extra credit. Create one below.</p></div>`;
}
