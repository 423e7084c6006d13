/** Who pays what for a forwarded request, by billing mode (its meter's pricing or the merchant-only one). */
import type { MeterPricing } from '../domain/pricing.ts';
import type { BillingContext } from '../gateway/credentials.ts';
import type { MeterRow } from '../storage/meters.ts';
import { MERCHANT_ONLY_PRICING, meterPricing } from './charge.ts';

/** A meter's pricing, parsed once per meter row (cached credentials share their rows). */
const pricingOfMeter = new WeakMap<MeterRow, MeterPricing>();

function cachedMeterPricing(meter: MeterRow): MeterPricing {
  let pricing = pricingOfMeter.get(meter);
  if (!pricing) {
    pricing = meterPricing(meter);
    pricingOfMeter.set(meter, pricing);
  }
  return pricing;
}

/** A customer's spend key: the customer's wallet pays the provider's base cost, and no fee. */
const CUSTOMER_SPEND_KEY_PRICING: MeterPricing = { ...MERCHANT_ONLY_PRICING, baseCostPayer: 'wallet' };

/** Who pays what for a forwarded request, by billing mode. */
export function pricingFor(billing: BillingContext): { pricing: MeterPricing; walletId: string; meterPriced: boolean } {
  const walletId = billing.connection?.wallet_id ?? billing.merchantWalletId;
  if (billing.spendKey && billing.connection) {
    return { pricing: CUSTOMER_SPEND_KEY_PRICING, walletId, meterPriced: false };
  }
  if (billing.meter && billing.mode !== 'billing_disabled') {
    return { pricing: cachedMeterPricing(billing.meter), walletId, meterPriced: true };
  }
  // Gateway mode, metering-only and disabled billing: no fee; the merchant pays the base cost.
  return { pricing: MERCHANT_ONLY_PRICING, walletId: billing.merchantWalletId, meterPriced: false };
}
