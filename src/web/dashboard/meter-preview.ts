/**
 * The price preview of the meter pages: what one request would pay under the tiers being edited,
 * priced by the real pricing code. Without JavaScript it is a GET form that prices the saved
 * tiers; with it (/assets/forms.js) it follows the form as the merchant types, asking
 * /dashboard/meters/preview, which changes nothing.
 */
import type { FastifyInstance } from 'fastify';
import type { AppDeps } from '../../app-deps.ts';
import { isTierList, parseTiers, PAYERS, RATE_TYPES, TIER_TYPES, TOKEN_BASES, type Tier, type TierType } from '../../domain/meters.ts';
import { formatMoney, MoneyFormatError, parseMoney } from '../../domain/money.ts';
import { priceRequest, tierStartUnits, toSeconds } from '../../domain/pricing.ts';
import type { MeterRow } from '../../storage/meters.ts';
import { formatsFor, type Formats } from '../format.ts';
import { html, type SafeHtml } from '../html.ts';

export type PreviewMeter = Pick<MeterRow, 'rate_type' | 'tier_type' | 'token_basis' | 'base_cost_payer' | 'service_charge_payer'>;
export type PreviewInput = { units: string; used: string; cost: string };

/** A typical request's usage in the meter's own unit: a million tokens or characters is a rate's basis, but a call is minutes long, and one request is one. */
export const DEFAULT_PREVIEW_UNITS: Record<TierType, string> = { tokens_1m: '1000000', characters_1m: '1000000', minutes: '10', requests: '1' };

const UNIT_WORD: Record<TierType, string> = { tokens_1m: 'tokens', characters_1m: 'characters', minutes: 'minutes', requests: 'requests' };

/** Tiers as the form writes them: one a line, `start rate` (space or comma between). */
export function tiersOfText(text: string): { start: string; rate: string }[] {
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const [start = '', rate = ''] = l.split(/[\s,]+/);
      return { start, rate };
    });
}

/** Tiers for the textarea; the rate exact, without the zeros past the cents ("2.50", "0.000125"), so it can be saved back unchanged. */
export function textOfTiers(tiers: Tier[]): string {
  return tiers.map((t) => `${t.start} ${formatMoney(t.rate).replace(/(\.\d\d\d*?)0+$/, '$1')}`).join('\n');
}

const whole = (text: string) => (/^\d{1,15}$/.test(text.trim()) ? Number(text.trim()) : null);

function costOf(text: string): bigint | null {
  if (!text.trim()) return 0n;
  try {
    const units = parseMoney(text.trim());
    return units >= 0n ? units : null;
  } catch (e) {
    if (e instanceof MoneyFormatError) return null;
    throw e;
  }
}

/** The fee of one request of `units` after `used` units this period, or why it cannot be priced. */
export function previewFee(meter: PreviewMeter, tiersText: string, input: PreviewInput, fmt: Formats): SafeHtml | string {
  const tiers = parseTiers(tiersOfText(tiersText));
  if (!isTierList(tiers)) return `Fix the tiers first (line ${tiers[0]!.index + 1}: ${tiers[0]!.message}).`;
  const units = whole(input.units);
  const used = whole(input.used || '0');
  if (units === null || used === null) return 'Enter whole, non-negative numbers of units.';
  const cost = costOf(input.cost);
  if (cost === null) return 'Enter the provider cost as a decimal number, e.g. 0.25.';
  const priced = priceRequest({
    meter: { rateType: meter.rate_type, tierType: meter.tier_type, tokenBasis: meter.token_basis, baseCostPayer: meter.base_cost_payer, serviceChargePayer: meter.service_charge_payer, tiers },
    usage: {
      inputTokens: 0,
      outputTokens: meter.tier_type === 'tokens_1m' ? units : 0,
      inputCharacters: 0,
      outputCharacters: meter.tier_type === 'characters_1m' ? units : 0,
      inputSeconds: toSeconds(0),
      outputSeconds: toSeconds(meter.tier_type === 'minutes' ? units * 60 : 0),
    },
    baseCost: { input: 0n, output: cost },
    accumulatedUnits: tierStartUnits(used, meter.tier_type),
    serviceChargeRate: 0n,
    baseCostCharged: false,
  });
  return fmt.money(priced.fee.amount);
}

type CardOptions = {
  /** The GET form's target: the meter's own page (prices its saved tiers without JavaScript). */
  action: string;
  /** The id of the form whose fields (tiers, rate and tier type) the live preview follows. */
  source: string;
  input: PreviewInput;
  fee: SafeHtml | string;
  /** The saved meter's terms (hidden fields), when the source form cannot change them. */
  meter?: PreviewMeter;
};

/** The preview card; its fee line is a live region, so a screen reader hears the new price. */
export function previewCard(o: CardOptions): SafeHtml {
  const unit = o.meter ? UNIT_WORD[o.meter.tier_type] : "the meter's unit";
  const hidden = o.meter
    ? (['rate_type', 'tier_type', 'token_basis', 'base_cost_payer', 'service_charge_payer'] as const).map((k) => html`<input type="hidden" name="${k}" value="${o.meter![k]}">`)
    : '';
  return html`<form class="card" method="get" action="${o.action}" id="price-preview" data-preview-source="${o.source}" data-preview-url="/dashboard/meters/preview">
<h2>Price preview</h2>
<p class="muted">What one request would pay under the tiers above${o.meter ? '' : ' (as you type them)'}; percentage meters take their share of the provider cost.</p>
${hidden}
<div class="filters">
<div><label for="p-units">Usage of one request (${unit})</label><input id="p-units" name="units" inputmode="numeric" value="${o.input.units}"></div>
<div><label for="p-used">Already used this period</label><input id="p-used" name="used" inputmode="numeric" value="${o.input.used}"></div>
<div><label for="p-cost">Provider cost of the request</label><input id="p-cost" name="cost" inputmode="decimal" value="${o.input.cost}" placeholder="0.00"></div>
<div><button type="submit">Preview</button></div></div>
<p role="status">Fee: <strong id="preview-fee">${o.fee}</strong></p>
</form>`;
}

const pick = <T extends string>(choices: readonly T[], value: unknown, fallback: T): T => (choices.includes(value as T) ? (value as T) : fallback);

/** GET /dashboard/meters/preview: the fee for the form's current values, as markup for the live region. */
export function registerMeterPreview(app: FastifyInstance, deps: AppDeps): void {
  const fmt = formatsFor(deps.config.currency);
  app.get<{ Querystring: Record<string, string | undefined> }>('/dashboard/meters/preview', async (request, reply) => {
    const q = request.query;
    const meter: PreviewMeter = {
      rate_type: pick(RATE_TYPES, q.rate_type, 'fixed'),
      tier_type: pick(TIER_TYPES, q.tier_type, 'tokens_1m'),
      token_basis: pick(TOKEN_BASES, q.token_basis, 'input+output'),
      base_cost_payer: pick(PAYERS, q.base_cost_payer, 'wallet'),
      service_charge_payer: pick(PAYERS, q.service_charge_payer, 'wallet'),
    };
    const fee = previewFee(meter, q.tiers ?? '', { units: q.units ?? '', used: q.used ?? '', cost: q.cost ?? '' }, fmt);
    return reply.header('cache-control', 'no-store').send({ fee: html`${fee}`.value });
  });
}
