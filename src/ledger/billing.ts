/** Who pays what for a forwarded request, by billing mode (its meter's pricing or the merchant-only one). */
import type { MeterPricing } from '../domain/pricing.ts';
import type { MeterRow } from '../storage/meters.ts';
import type { SpendKeyRow } from '../storage/spend-keys.ts';
import { MERCHANT_ONLY_PRICING, meterPricing } from './decide/charge.ts';

export type BillingMode = 'customer' | 'meter_only' | 'merchant' | 'unmanaged_metering' | 'billing_disabled';

export type BillingContext = {
  merchantId: string;
  merchantWalletId: string;
  /** The authenticated secret key (scopes rate limits, idempotency keys, logs). */
  secretKeyId: string;
  mode: BillingMode;
  /** The customer (connection) the request is recorded for; null unless customer or billing_disabled. */
  connection: { id: string; wallet_id: string } | null;
  /** The meter that prices / attributes the request; null in merchant and unmanaged_metering. */
  meter: MeterRow | null;
  /** The caller's own provider key (BYOK); null = the gateway's managed key. */
  providerKey: string | null;
  providerKeyType: 'managed' | 'unmanaged';
  /**
   * Whose wallet the request is billed to: `customer` only in `customer` mode (where the meter's
   * payers may still put the base cost or service charge on the merchant); `merchant` otherwise.
   */
  payer: 'customer' | 'merchant';
  /** The merchant's own service-charge rate (percent of the fee, 1e-10 units); null = operator default. */
  serviceChargeRate: bigint | null;
  /** The spend key used as the credential, whose limits are enforced (ledger/spend-key-limits.ts). */
  spendKey?: SpendKeyRow | null;
  /**
   * The customer's usage is on a meter linked to the plan of its live subscription, so it draws
   * the wallet's cycle credit, then bundle credit, then prepaid balance; absent or false: only the
   * prepaid balance is available to it and pays it (decision 0016).
   */
  drawsPlanCredit?: boolean;
};

/** A customer's spend key: the customer's wallet pays the provider's base cost, and no fee. */
const CUSTOMER_SPEND_KEY_PRICING: MeterPricing = { ...MERCHANT_ONLY_PRICING, baseCostPayer: 'wallet' };

/** Who pays what for a forwarded request, by billing mode. */
export function pricingFor(billing: BillingContext): { pricing: MeterPricing; walletId: string; meterPriced: boolean } {
  const walletId = billing.connection?.wallet_id ?? billing.merchantWalletId;
  if (billing.spendKey && billing.connection) {
    return { pricing: CUSTOMER_SPEND_KEY_PRICING, walletId, meterPriced: false };
  }
  if (billing.meter && billing.mode !== 'billing_disabled') {
    return { pricing: meterPricing(billing.meter), walletId, meterPriced: true };
  }
  // Gateway mode, metering-only and disabled billing: no fee; the merchant pays the base cost.
  return { pricing: MERCHANT_ONLY_PRICING, walletId: billing.merchantWalletId, meterPriced: false };
}
