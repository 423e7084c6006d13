import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { deserializeTiers, isTierList, parseTiers, serializeTiers, type Tier } from '../../domain/meters.ts';
import { formatMoney } from '../../domain/money.ts';
import { priceRequest, tierStartUnits, toSeconds } from '../../domain/pricing.ts';
import type { AppDeps } from '../../app-deps.ts';
import { findMeter, listMeters, updateMeter, type MeterRow } from '../../storage/meters.ts';
import { formatsFor, type Formats } from '../format.ts';
import { html, type SafeHtml } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const RATE_UNIT = { tokens_1m: 'per 1M tokens', characters_1m: 'per 1M characters', minutes: 'per minute', requests: 'per request' } as const;

/**
 * The tiers textarea: one tier a line, `start rate` (space or comma between). The rate is exact,
 * without the zeros past the cents ("2.50", "0.000125"), so it can be saved back unchanged.
 */
function tiersText(tiers: Tier[]): string {
  return tiers.map((t) => `${t.start} ${formatMoney(t.rate).replace(/(\.\d\d\d*?)0+$/, '$1')}`).join('\n');
}

function parseTiersText(text: string): Tier[] | string {
  const lines = text.split(/\r?\n/).map((l) => l.trim()).filter(Boolean);
  const raw = lines.map((l) => {
    const [start = '', rate = ''] = l.split(/[\s,]+/);
    return { start, rate };
  });
  const parsed = parseTiers(raw);
  if (isTierList(parsed)) return parsed;
  return parsed.map((p) => `line ${p.index + 1}: ${p.message}`).join('; ');
}

type Preview = { units: string; used: string };

/** A typical request's usage in the meter's own unit: a million tokens or characters is a rate's basis, but a call is minutes long, and one request is one. */
const DEFAULT_PREVIEW_UNITS: Record<MeterRow['tier_type'], string> = { tokens_1m: '1000000', characters_1m: '1000000', minutes: '10', requests: '1' };

/** What one request of `units` would pay at each tier, after `used` units this period: the real pricing code. */
function previewOf(meter: MeterRow, tiers: Tier[], preview: Preview, fmt: Formats): SafeHtml | null {
  const units = Number(preview.units);
  const used = Number(preview.used || '0');
  if (!Number.isSafeInteger(units) || units < 0 || !Number.isSafeInteger(used) || used < 0) return null;
  const tokens = meter.tier_type === 'tokens_1m' ? units : 0;
  const priced = priceRequest({
    meter: { rateType: meter.rate_type, tierType: meter.tier_type, tokenBasis: meter.token_basis, baseCostPayer: meter.base_cost_payer, serviceChargePayer: meter.service_charge_payer, tiers },
    usage: {
      inputTokens: 0,
      outputTokens: tokens,
      inputCharacters: 0,
      outputCharacters: meter.tier_type === 'characters_1m' ? units : 0,
      inputSeconds: toSeconds(0),
      outputSeconds: toSeconds(meter.tier_type === 'minutes' ? units * 60 : 0),
    },
    baseCost: { input: 0n, output: 0n },
    accumulatedUnits: tierStartUnits(used, meter.tier_type),
    serviceChargeRate: 0n,
    baseCostCharged: false,
  });
  return fmt.money(priced.fee.amount);
}

export function registerMeterPages(app: FastifyInstance, deps: AppDeps): void {
  const fmt = formatsFor(deps.config.currency);
  app.get('/dashboard/meters', async (request, reply) => {
    const meters = await listMeters(deps.storage, merchantOf(request), undefined, 100);
    return sendDashboardPage(request, reply, '/dashboard/meters', {
      title: 'Meters',
      main: html`<h1>Meters</h1>
${
  meters.length === 0
    ? html`<div class="card"><h2>No meters yet</h2><p>A meter is the price you charge. Create one with your secret key:</p>
<pre class="secret">curl -X POST $TOLLGATE/v1/meters -H "Authorization: Bearer sk_live_…" -H "Content-Type: application/json" \\
  -d '{"name":"Chat","rate_type":"fixed","tier_type":"tokens_1m","tiers":[{"start":0,"rate":"2.00"}]}'</pre></div>`
    : html`<div class="card table-wrap" tabindex="0" role="region" aria-label="Meters"><table><caption class="visually-hidden">Meters</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Slug</th><th scope="col">Type</th><th scope="col">Tiers</th></tr></thead><tbody>
${meters.slice(0, 100).map((m) => html`<tr><td><a href="/dashboard/meters/${m.id}">${m.name}</a></td><td><code>${m.slug}</code></td><td>${m.rate_type}, ${m.tier_type}</td><td>${deserializeTiers(m.tiers).length}</td></tr>`)}
</tbody></table></div>`
}`,
    });
  });

  app.get<{ Params: { id: string }; Querystring: Partial<Preview> }>('/dashboard/meters/:id', async (request, reply) => {
    const meter = await meterOf(deps, request);
    return meterPage(request, reply, fmt, meter, { preview: { units: request.query.units ?? DEFAULT_PREVIEW_UNITS[meter.tier_type], used: request.query.used ?? '0' } });
  });

  app.post<{ Params: { id: string } }>('/dashboard/meters/:id', async (request, reply) => {
    assertCsrf(request);
    const meter = await meterOf(deps, request);
    const text = String((request.body as Record<string, unknown>).tiers ?? '');
    const tiers = parseTiersText(text);
    if (typeof tiers === 'string') return meterPage(request, reply, fmt, meter, { error: tiers, text, status: 400 });
    const updated = await updateMeter(deps.storage, merchantOf(request), meter.id, { tiers: serializeTiers(tiers) });
    return meterPage(request, reply, fmt, updated ?? meter, { message: 'Tiers saved.' });
  });
}

async function meterOf(deps: AppDeps, request: FastifyRequest<{ Params: { id: string } }>): Promise<MeterRow> {
  const meter = await findMeter(deps.storage, merchantOf(request), request.params.id);
  if (!meter) throw new WebError(404, `No meter with id ${request.params.id}.`);
  return meter;
}

function meterPage(
  request: FastifyRequest,
  reply: FastifyReply,
  fmt: Formats,
  meter: MeterRow,
  opts: { error?: string; message?: string; text?: string; status?: number; preview?: Preview },
): FastifyReply {
  const tiers = deserializeTiers(meter.tiers);
  const preview = opts.preview ?? { units: DEFAULT_PREVIEW_UNITS[meter.tier_type], used: '0' };
  const fee = previewOf(meter, tiers, preview, fmt);
  return sendDashboardPage(request, reply, '/dashboard/meters', {
    title: `Meter ${meter.name}`,
    status: opts.status,
    main: html`<h1>Meter ${meter.name}</h1>
<div class="card"><dl class="kv"><dt>Slug</dt><dd><code>${meter.slug}</code></dd><dt>Rate type</dt><dd>${meter.rate_type}</dd>
<dt>Tier type</dt><dd>${meter.tier_type}</dd><dt>Token basis</dt><dd>${meter.token_basis}</dd></dl></div>
${opts.message ? html`<p role="status" class="notice">${opts.message}</p>` : ''}
<form class="card" method="post" action="/dashboard/meters/${meter.id}">
${csrfField(request, reply)}
<h2>Tiers</h2>
${opts.error ? html`<p class="error" role="alert" id="tiers-error">${opts.error}</p>` : ''}
<label for="tiers">One tier a line: start (in ${meter.tier_type === 'minutes' ? 'minutes' : 'units'} used this period) and rate
(${meter.rate_type === 'percentage' ? 'percent of base cost' : RATE_UNIT[meter.tier_type]})</label>
<textarea id="tiers" name="tiers" rows="${Math.max(3, tiers.length + 1)}"${opts.error ? html` aria-describedby="tiers-error" aria-invalid="true"` : ''}>${opts.text ?? tiersText(tiers)}</textarea>
<button type="submit">Save tiers</button>
</form>
<form class="card" method="get" action="/dashboard/meters/${meter.id}">
<h2>Price preview</h2>
<div class="filters">
<div><label for="p-units">Usage of one request (${meter.tier_type === 'tokens_1m' ? 'tokens' : meter.tier_type === 'characters_1m' ? 'characters' : meter.tier_type})</label><input id="p-units" name="units" inputmode="numeric" value="${preview.units}"></div>
<div><label for="p-used">Already used this period</label><input id="p-used" name="used" inputmode="numeric" value="${preview.used}"></div>
<div><button type="submit">Preview</button></div></div>
<p role="status">Fee: <strong id="preview-fee">${fee ?? 'enter whole, non-negative numbers'}</strong>${meter.rate_type === 'percentage' ? ' (percentage rates depend on the provider cost, 0 in this preview)' : ''}</p>
</form>
<p><a href="/dashboard/meters">All meters</a></p>`,
  });
}
