import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AppDeps } from '../../app-deps.ts';
import { deserializeTiers, TIER_TYPES } from '../../domain/meters.ts';
import { changeMeter, createMeter, getMeter, listMeterPage, meterCreateBody, meterUpdateBody } from '../../services/meters.ts';
import type { MeterRow } from '../../storage/meters.ts';
import { formatsFor, type Formats } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { formSummary, formText, selectField, submit, textareaField, textField, type FieldErrors, type Form, type FormSpec } from './form-fields.ts';
import { DEFAULT_PREVIEW_UNITS, previewCard, previewFee, registerMeterPreview, textOfTiers, tiersOfText, type PreviewInput, type PreviewMeter } from './meter-preview.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;
const FORMS_SCRIPT = '/assets/forms.js';

const RATE_UNIT = { tokens_1m: 'per 1M tokens', characters_1m: 'per 1M characters', minutes: 'per minute', requests: 'per request' } as const;
const CHOICES = {
  rate_type: [['fixed', 'A fixed rate per unit'], ['percentage', 'A percentage of the provider cost']],
  tier_type: [['tokens_1m', 'Tokens (rate per 1M)'], ['characters_1m', 'Characters (rate per 1M)'], ['minutes', 'Minutes (rate per minute)'], ['requests', 'Requests (rate per request)']],
  token_basis: [['input+output', 'Input and output tokens'], ['output', 'Output tokens only']],
  payer: [['wallet', "The customer's wallet"], ['merchant', 'You (the merchant)']],
} as const satisfies Record<string, readonly (readonly [string, string])[]>;

const METER_FORM: FormSpec = {
  labels: {
    name: 'Name',
    meter_slug: 'Slug',
    rate_type: 'Rate',
    tier_type: 'Unit',
    token_basis: 'Tokens counted',
    base_cost_payer: 'Provider cost paid by',
    service_charge_payer: 'Service charge paid by',
    tiers: 'Tiers',
  },
  labelOf: (path) => (path[0] === 'tiers' && path[1] !== undefined ? `Tiers, line ${Number(path[1]) + 1}` : undefined),
  codeFields: { meter_slug_taken: 'meter_slug' },
};

type MeterForm = { form: Form; errors: FieldErrors };
type Notice = { created?: string; saved?: string };

/** The create form as the body POST /v1/meters takes (a blank slug: derived from the name). */
function createBodyOf(form: Form): Record<string, unknown> {
  const body: Record<string, unknown> = { name: formText(form, 'name'), tiers: tiersOfText(form.tiers ?? '') };
  for (const field of ['rate_type', 'tier_type', 'token_basis', 'base_cost_payer', 'service_charge_payer', 'meter_slug'] as const) {
    if (formText(form, field)) body[field] = formText(form, field);
  }
  return body;
}

const previewInputOf = (q: Partial<PreviewInput>, tierType: MeterRow['tier_type']): PreviewInput => ({ units: q.units ?? DEFAULT_PREVIEW_UNITS[tierType], used: q.used ?? '0', cost: q.cost ?? '' });

export function registerMeterPages(app: FastifyInstance, deps: AppDeps): void {
  const fmt = formatsFor(deps.config.currency);
  registerMeterPreview(app, deps);

  const listPage = async (request: FastifyRequest, reply: FastifyReply, create: MeterForm & { status?: number } = { form: {}, errors: {} }) => {
    const meters = (await listMeterPage(deps.storage, merchantOf(request), undefined, LIST_LIMIT)).slice(0, LIST_LIMIT);
    return sendDashboardPage(request, reply, '/dashboard/meters', {
      title: 'Meters',
      status: create.status,
      scripts: [FORMS_SCRIPT],
      main: html`<h1>Meters</h1>
${meters.length === 0 ? emptyMeters() : meterTable(meters)}
${createForm(request, reply, create, fmt)}`,
    });
  };

  app.get('/dashboard/meters', (request, reply) => listPage(request, reply));

  app.post('/dashboard/meters', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const done = await submit(meterCreateBody, createBodyOf(form), METER_FORM, (body) => createMeter(deps, merchantOf(request), body));
    if (!done.ok) return listPage(request, reply, { form, errors: done.errors, status: done.status });
    return reply.redirect(`/dashboard/meters/${encodeURIComponent(done.value.id)}?created=1`, 303);
  });

  app.get<{ Params: { id: string }; Querystring: Partial<PreviewInput> & Notice }>('/dashboard/meters/:id', async (request, reply) => {
    const meter = await meterOf(deps, request);
    const notice = request.query.created ? 'Meter created.' : request.query.saved ? 'Meter saved.' : undefined;
    return meterPage(request, reply, fmt, meter, { preview: previewInputOf(request.query, meter.tier_type), notice });
  });

  app.post<{ Params: { id: string } }>('/dashboard/meters/:id', async (request, reply) => {
    assertCsrf(request);
    const meter = await meterOf(deps, request);
    const form = (request.body ?? {}) as Form;
    const body = { name: formText(form, 'name'), tiers: tiersOfText(form.tiers ?? '') };
    const done = await submit(meterUpdateBody, body, METER_FORM, (changes) => changeMeter(deps.storage, merchantOf(request), meter.id, changes));
    if (!done.ok) return meterPage(request, reply, fmt, meter, { edit: { form, errors: done.errors }, status: done.status });
    return reply.redirect(`/dashboard/meters/${encodeURIComponent(meter.id)}?saved=1`, 303);
  });
}

async function meterOf(deps: AppDeps, request: FastifyRequest<{ Params: { id: string } }>): Promise<MeterRow> {
  try {
    return await getMeter(deps.storage, merchantOf(request), request.params.id);
  } catch {
    throw new WebError(404, `No meter with id ${request.params.id}.`);
  }
}

function meterTable(meters: MeterRow[]) {
  return html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Meters"><table><caption class="visually-hidden">Meters</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Slug</th><th scope="col">Type</th><th scope="col">Tiers</th></tr></thead><tbody>
${meters.map((m) => html`<tr><td><a href="/dashboard/meters/${m.id}">${m.name}</a></td><td><code>${m.slug}</code></td><td>${m.rate_type}, ${m.tier_type}</td><td>${deserializeTiers(m.tiers).length}</td></tr>`)}
</tbody></table></div>`;
}

function emptyMeters() {
  return html`<div class="card"><h2>No meters yet</h2><p>A meter is the price you charge. Create one with the form below, or with your secret key:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/meters -H "Authorization: Bearer sk_live_…" -H "Content-Type: application/json" \\
  -d '{"name":"Chat","rate_type":"fixed","tier_type":"tokens_1m","tiers":[{"start":0,"rate":"2.00"}]}'</pre></div>`;
}

const TIERS_HINT = 'One tier a line: where it starts (units used this period; the first starts at 0) and its rate, e.g. "0 2.00" then "1000000 1.50". A percentage rate is in percent of the provider cost.';

function createForm(request: FastifyRequest, reply: FastifyReply, create: MeterForm, fmt: Formats) {
  const f: Form = { rate_type: 'fixed', tier_type: 'tokens_1m', token_basis: 'input+output', base_cost_payer: 'wallet', service_charge_payer: 'wallet', tiers: '0 2.00', ...create.form };
  const { errors } = create;
  const select = (name: string, options: readonly (readonly [string, string])[]) =>
    selectField({ id: `meter-${name.replace(/_/g, '-')}`, name, label: METER_FORM.labels[name]!, value: f[name] ?? '', errors, options });
  const previewMeter: PreviewMeter = {
    rate_type: f.rate_type === 'percentage' ? 'percentage' : 'fixed',
    tier_type: (TIER_TYPES as readonly string[]).includes(f.tier_type ?? '') ? (f.tier_type as MeterRow['tier_type']) : 'tokens_1m',
    token_basis: f.token_basis === 'output' ? 'output' : 'input+output',
    base_cost_payer: 'wallet',
    service_charge_payer: 'wallet',
  };
  const input = previewInputOf({}, previewMeter.tier_type);
  return html`<form class="card" method="post" action="/dashboard/meters" id="meter-form" novalidate>
${csrfField(request, reply)}
<h2>Create a meter</h2>
${formSummary(errors, 'meter-create-error')}
${textField({ id: 'meter-name', name: 'name', label: 'Name', value: f.name ?? '', errors, extra: html` maxlength="255" autocomplete="off"` })}
${textField({ id: 'meter-slug', name: 'meter_slug', label: 'Slug (optional)', value: f.meter_slug ?? '', errors, hint: 'How requests name the meter; blank: made from the name.', extra: html` maxlength="64" autocomplete="off"` })}
<div class="filters">
${select('rate_type', CHOICES.rate_type)}
${select('tier_type', CHOICES.tier_type)}
${select('token_basis', CHOICES.token_basis)}
</div><div class="filters">
${select('base_cost_payer', CHOICES.payer)}
${select('service_charge_payer', CHOICES.payer)}
</div>
${textareaField({ id: 'meter-tiers', name: 'tiers', label: 'Tiers', value: f.tiers ?? '', errors, rows: 4, hint: TIERS_HINT })}
<button type="submit">Create meter</button>
</form>
${previewCard({ action: '/dashboard/meters', source: 'meter-form', input, fee: previewFee(previewMeter, f.tiers ?? '', input, fmt) })}`;
}

function meterPage(
  request: FastifyRequest,
  reply: FastifyReply,
  fmt: Formats,
  meter: MeterRow,
  opts: { notice?: string | undefined; edit?: MeterForm; status?: number; preview?: PreviewInput },
): FastifyReply {
  const tiers = deserializeTiers(meter.tiers);
  const form = opts.edit?.form ?? { name: meter.name, tiers: textOfTiers(tiers) };
  const errors = opts.edit?.errors;
  const preview = opts.preview ?? previewInputOf({}, meter.tier_type);
  const rateWord = meter.rate_type === 'percentage' ? 'percent of the provider cost' : RATE_UNIT[meter.tier_type];
  return sendDashboardPage(request, reply, '/dashboard/meters', {
    title: `Meter ${meter.name}`,
    status: opts.status,
    scripts: [FORMS_SCRIPT],
    main: html`<h1>Meter ${meter.name}</h1>
${opts.notice ? html`<p role="status" class="notice" id="meter-notice">${opts.notice}</p>` : ''}
<div class="card"><dl class="kv"><dt>Meter id</dt><dd><code>${meter.id}</code></dd><dt>Slug</dt><dd><code>${meter.slug}</code></dd><dt>Rate type</dt><dd>${meter.rate_type}</dd>
<dt>Tier type</dt><dd>${meter.tier_type}</dd><dt>Token basis</dt><dd>${meter.token_basis}</dd>
<dt>Provider cost paid by</dt><dd>${meter.base_cost_payer}</dd><dt>Service charge paid by</dt><dd>${meter.service_charge_payer}</dd></dl>
<p class="muted">Rate type, unit, basis and payers are fixed once a meter exists (as in <code>PATCH /v1/meters/{id}</code>); create another meter to change them.</p></div>
<form class="card" method="post" action="/dashboard/meters/${meter.id}" id="meter-form" novalidate>
${csrfField(request, reply)}
<h2>Edit</h2>
${formSummary(errors, 'meter-edit-error')}
${textField({ id: 'meter-name', name: 'name', label: 'Name', value: form.name ?? '', errors, extra: html` maxlength="255" autocomplete="off"` })}
${textareaField({ id: 'tiers', name: 'tiers', label: `Tiers (start in ${meter.tier_type === 'minutes' ? 'minutes' : 'units'} used this period, rate ${rateWord})`, value: form.tiers ?? '', errors, rows: Math.max(3, tiers.length + 1), hint: TIERS_HINT })}
<button type="submit">Save meter</button>
</form>
${previewCard({ action: `/dashboard/meters/${meter.id}`, source: 'meter-form', input: preview, meter, fee: previewFee(meter, textOfTiers(tiers), preview, fmt) })}
<p><a href="/dashboard/meters">All meters</a></p>`,
  });
}
