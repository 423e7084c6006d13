/**
 * The Alerts page: the merchant's alert rules (decision 0043) with their state, a form to create
 * one, each rule's page to change or delete it, and the latest firings. The forms take the same
 * schemas and call the same service functions as /v1/alerts.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AppDeps } from '../../app-deps.ts';
import { formatMoney, parseMoney } from '../../domain/money.ts';
import { nowOf } from '../../http/types.ts';
import {
  alertCreateBody,
  alertUpdateBody,
  changeAlert,
  createAlert,
  listAlertPage,
  listFiringPage,
  presentAlert,
  recentFirings,
  removeAlert,
  type Alert,
} from '../../services/alerts.ts';
import { findAlert, type AlertFiringRow, type AlertRow } from '../../storage/alerts.ts';
import { customerNames } from '../../storage/customer-names.ts';
import { customerLink, formatsFor, type Formats } from '../format.ts';
import { html, type SafeHtml } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { formSummary, formText, selectField, submit, textField, type FieldErrors, type Form, type FormSpec } from './form-fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const RULES_SHOWN = 100;
const FIRINGS_SHOWN = 25;

const ALERT_FORM: FormSpec = {
  labels: { kind: 'Alert when', customer_id: 'Customer', spend_key_id: 'Spend key', threshold: 'Threshold', period: 'Period', enabled: 'Status' },
};
const KIND_OPTIONS = [
  ['low_balance', "A customer's balance falls below the threshold"],
  ['spend_threshold', "A customer's or spend key's spend reaches the threshold"],
] as const;
const PERIOD_OPTIONS = [
  ['', 'None (low balance)'],
  ['day', 'Per UTC day'],
  ['month', 'Per UTC month'],
  ['total', 'In total'],
] as const;
const STATUS_OPTIONS = [
  ['true', 'Enabled'],
  ['false', 'Disabled'],
] as const;
const PERIOD_LABELS: Record<string, string> = { day: 'per day', month: 'per month', total: 'in total' };

/** The form as the body POST or PATCH /v1/alerts takes: blank fields are left out. */
function alertBody(form: Form, fields: readonly string[]): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const field of fields) {
    const value = formText(form, field);
    if (value === '') continue;
    body[field] = field === 'enabled' ? value === 'true' : value;
  }
  return body;
}

type FormState = { form: Form; errors: FieldErrors; status: number };

/** The signed-in merchant's alert the path names, or the dashboard's 404 page. */
async function alertOf(deps: AppDeps, request: FastifyRequest<{ Params: { id: string } }>): Promise<AlertRow> {
  const row = await findAlert(deps.storage, merchantOf(request), request.params.id);
  if (!row) throw new WebError(404, `No alert with id ${request.params.id}.`);
  return row;
}

export function registerAlertPages(app: FastifyInstance, deps: AppDeps): void {
  const fmt = formatsFor(deps.config.currency);

  const listPage = async (request: FastifyRequest, reply: FastifyReply, create: FormState = { form: {}, errors: {}, status: 200 }, notice?: string) => {
    const merchantId = merchantOf(request);
    const now = new Date(nowOf(deps));
    const rules = (await listAlertPage(deps.storage, merchantId, undefined, RULES_SHOWN)).slice(0, RULES_SHOWN);
    const firings = await recentFirings(deps.storage, merchantId, FIRINGS_SHOWN);
    const names = await customerNames(deps.storage, merchantId, rules.map((r) => r.connection_id));
    const byId = new Map(rules.map((r) => [r.id, r]));
    return sendDashboardPage(request, reply, '/dashboard/alerts', {
      title: 'Alerts',
      status: create.status,
      main: html`<h1>Alerts</h1>
${notice ? html`<p class="notice" role="status" id="alert-notice">${notice}</p>` : ''}
<p class="muted">Each minute every enabled alert is checked; a crossing is reported once, as an <code>alert.triggered</code> webhook event, until the balance recovers or the period ends.</p>
${rules.length === 0 ? html`<div class="card"><h2>No alerts yet</h2><p>Create one below, or with <code>POST /v1/alerts</code>.</p></div>` : ruleTable(rules.map((r) => presentAlert(r, now)), names, fmt)}
${createForm(request, reply, create)}
${firingTable('Recent firings', firings, byId, names, fmt)}`,
    });
  };

  app.get<{ Querystring: { deleted?: string } }>('/dashboard/alerts', (request, reply) => listPage(request, reply, undefined, request.query.deleted ? 'Alert deleted.' : undefined));

  app.post('/dashboard/alerts', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const body = alertBody(form, ['kind', 'customer_id', 'spend_key_id', 'threshold', 'period', 'enabled']);
    const done = await submit(alertCreateBody, body, ALERT_FORM, (parsed) => createAlert(deps, merchantOf(request), parsed));
    if (!done.ok) return listPage(request, reply, { form, errors: done.errors, status: done.status });
    return reply.redirect(`/dashboard/alerts/${encodeURIComponent(done.value.id)}?created=1`, 303);
  });

  const rulePage = async (request: FastifyRequest<{ Params: { id: string } }>, reply: FastifyReply, edit?: FormState, notice?: string) => {
    const merchantId = merchantOf(request);
    const row = await alertOf(deps, request);
    const alert = presentAlert(row, new Date(nowOf(deps)));
    const names = await customerNames(deps.storage, merchantId, [row.connection_id]);
    const firings = (await listFiringPage(deps.storage, merchantId, row.id, undefined, FIRINGS_SHOWN)).slice(0, FIRINGS_SHOWN);
    return sendDashboardPage(request, reply, '/dashboard/alerts', {
      title: `Alert ${alert.alert_id}`,
      status: edit?.status,
      main: html`<h1>Alert <span class="secret">${alert.alert_id}</span></h1>
${notice ? html`<p class="notice" role="status" id="alert-notice">${notice}</p>` : ''}
<div class="card"><h2>Rule</h2><dl class="kv">
<dt>Watches</dt><dd>${ruleText(alert, names, fmt)}</dd>
<dt>Status</dt><dd>${alert.enabled ? 'Enabled' : 'Disabled'}</dd>
<dt>State</dt><dd id="alert-state">${stateText(alert)}</dd>
<dt>Created</dt><dd>${alert.created_at}</dd>
</dl>
<p class="actions">${confirmLink(`/dashboard/alerts/${alert.alert_id}/delete`, 'Delete', `Delete alert ${alert.alert_id}`, true)}</p></div>
${editForm(request, reply, row, edit)}
${firingTable('Firings', firings, new Map([[row.id, row]]), names, fmt)}
<p><a href="/dashboard/alerts">All alerts</a></p>`,
    });
  };

  app.get<{ Params: { id: string }; Querystring: { created?: string; saved?: string } }>('/dashboard/alerts/:id', (request, reply) =>
    rulePage(request, reply, undefined, request.query.created ? 'Alert created.' : request.query.saved ? 'Alert saved.' : undefined),
  );

  app.post<{ Params: { id: string } }>('/dashboard/alerts/:id', async (request, reply) => {
    assertCsrf(request);
    const row = await alertOf(deps, request);
    const form = (request.body ?? {}) as Form;
    const done = await submit(alertUpdateBody, alertBody(form, ['threshold', 'period', 'enabled']), ALERT_FORM, (parsed) =>
      changeAlert(deps, merchantOf(request), row.id, parsed),
    );
    if (!done.ok) return rulePage(request, reply, { form, errors: done.errors, status: done.status });
    return reply.redirect(`/dashboard/alerts/${encodeURIComponent(done.value.id)}?saved=1`, 303);
  });

  app.get<{ Params: { id: string } }>('/dashboard/alerts/:id/delete', async (request, reply) => {
    const row = await alertOf(deps, request);
    return sendConfirmPage(request, reply, '/dashboard/alerts', {
      question: `Delete the alert ${row.id}?`,
      consequence: 'It stops being checked and its firings are deleted with it. Events already sent stay with your webhooks. This cannot be undone.',
      action: `/dashboard/alerts/${row.id}/delete`,
      confirmLabel: 'Delete the alert',
      back: `/dashboard/alerts/${row.id}`,
    });
  });

  app.post<{ Params: { id: string } }>('/dashboard/alerts/:id/delete', async (request, reply) => {
    assertCsrf(request);
    const row = await alertOf(deps, request);
    await removeAlert(deps.storage, merchantOf(request), row.id);
    return reply.redirect('/dashboard/alerts?deleted=1', 303);
  });
}

function subjectOf(alert: Pick<Alert, 'customer_id' | 'spend_key_id'>, names: ReadonlyMap<string, string>): SafeHtml {
  if (alert.customer_id !== null) return customerLink(alert.customer_id, names);
  return html`spend key <a href="/dashboard/spend-keys/${alert.spend_key_id ?? ''}">${alert.spend_key_id ?? ''}</a>`;
}

function ruleText(alert: Alert, names: ReadonlyMap<string, string>, fmt: Formats): SafeHtml {
  const threshold = fmt.money(parseMoney(alert.threshold));
  if (alert.kind === 'low_balance') return html`Balance of ${subjectOf(alert, names)} below ${threshold}`;
  return html`Spend of ${subjectOf(alert, names)} ${PERIOD_LABELS[alert.period ?? 'total']} reaching ${threshold}`;
}

const stateText = (alert: Alert) =>
  alert.state === 'triggered' ? `Triggered at ${(alert.triggered_at ?? '').slice(0, 16).replace('T', ' ')} UTC` : alert.enabled ? 'Armed' : 'Off';

function ruleTable(alerts: Alert[], names: ReadonlyMap<string, string>, fmt: Formats): SafeHtml {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-labelledby="alerts-title"><h2 id="alerts-title">Alert rules</h2><table id="alerts">
<thead><tr><th scope="col">Rule</th><th scope="col">Status</th><th scope="col">State</th><th scope="col">Actions</th></tr></thead>
<tbody>${alerts.map(
    (a) => html`<tr><td>${ruleText(a, names, fmt)}</td><td>${a.enabled ? 'Enabled' : 'Disabled'}</td><td>${stateText(a)}</td>
<td class="actions"><a class="button secondary" href="/dashboard/alerts/${a.alert_id}" aria-label="Edit alert ${a.alert_id}">Edit</a> ${confirmLink(`/dashboard/alerts/${a.alert_id}/delete`, 'Delete', `Delete alert ${a.alert_id}`, true)}</td></tr>`,
  )}</tbody></table></div>`;
}

function firingTable(title: string, firings: AlertFiringRow[], rules: ReadonlyMap<string, AlertRow>, names: ReadonlyMap<string, string>, fmt: Formats): SafeHtml {
  if (firings.length === 0) return html`<div class="card"><h2>${title}</h2><p>Nothing has fired yet.</p></div>`;
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-labelledby="firings-title"><h2 id="firings-title">${title}</h2><table id="firings">
<thead><tr><th scope="col">Fired (UTC)</th><th scope="col">Alert</th><th scope="col" class="num">Value</th><th scope="col" class="num">Threshold</th><th scope="col">Event</th></tr></thead>
<tbody>${firings.map((f) => {
    const rule = rules.get(f.alert_id);
    return html`<tr><td>${f.fired_at.slice(0, 19).replace('T', ' ')}</td><td>${rule ? subjectOf({ customer_id: rule.connection_id, spend_key_id: rule.spend_key_id }, names) : ''} <a href="/dashboard/alerts/${f.alert_id}">${f.alert_id}</a></td>
<td class="num">${fmt.money(BigInt(f.value))}</td><td class="num">${fmt.money(BigInt(f.threshold))}</td><td><code>${f.event_id}</code></td></tr>`;
  })}</tbody></table></div>`;
}

function createForm(request: FastifyRequest, reply: FastifyReply, state: FormState): SafeHtml {
  const { form, errors } = state;
  const field = (name: string) => ({ id: `new-alert-${name.replace('_', '-')}`, name, label: ALERT_FORM.labels[name]!, value: form[name] ?? '', errors });
  return html`<form class="card" method="post" action="/dashboard/alerts" novalidate>
${csrfField(request, reply)}
<h2>Create an alert</h2>
${formSummary(errors, 'alert-create-error')}
${selectField({ ...field('kind'), options: KIND_OPTIONS })}
${textField({ ...field('customer_id'), hint: 'The customer id or your reference id; leave blank for a spend key.', extra: html` autocomplete="off"` })}
${textField({ ...field('spend_key_id'), hint: 'A spend key id (spk_…), for a spend alert instead of a customer.', extra: html` autocomplete="off"` })}
${textField({ ...field('threshold'), hint: 'An amount, e.g. 5.00.', extra: html` inputmode="decimal" autocomplete="off"` })}
${selectField({ ...field('period'), options: PERIOD_OPTIONS, hint: 'For a spend alert: the window the spend is counted over.' })}
${selectField({ ...field('enabled'), value: form.enabled ?? 'true', options: STATUS_OPTIONS })}
<button type="submit">Create alert</button>
</form>`;
}

function editForm(request: FastifyRequest, reply: FastifyReply, row: AlertRow, state: FormState | undefined): SafeHtml {
  const form = state?.form ?? { threshold: formatMoney(BigInt(row.threshold)), period: row.period ?? '', enabled: Number(row.enabled) === 1 ? 'true' : 'false' };
  const errors = state?.errors;
  const field = (name: string) => ({ id: `alert-${name}`, name, label: ALERT_FORM.labels[name]!, value: form[name] ?? '', errors });
  return html`<form class="card" method="post" action="/dashboard/alerts/${row.id}" novalidate>
${csrfField(request, reply)}
<h2>Change</h2>
<p class="muted">A new threshold or period re-arms the alert, as <code>PATCH /v1/alerts/{id}</code> does.</p>
${formSummary(errors, 'alert-edit-error')}
${textField({ ...field('threshold'), extra: html` inputmode="decimal" autocomplete="off"` })}
${row.kind === 'spend_threshold' ? selectField({ ...field('period'), options: PERIOD_OPTIONS.slice(1) }) : ''}
${selectField({ ...field('enabled'), options: STATUS_OPTIONS })}
<button type="submit">Save alert</button>
</form>`;
}
