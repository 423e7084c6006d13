/**
 * The money side of a forwarded request: admit (hold + pending record), then settle (charge the
 * actual cost against the holds) or fail (release the holds, record `error`, charge nothing).
 */
import type { MeterPricing, Usage, BasePrices } from '../domain/pricing.ts';
import type { BillingContext } from '../gateway/credentials.ts';
import { finishReservation, reserveForRequest, settleReservation } from '../gateway/spend-key-guard.ts';
import type { ApiError } from '../http/errors.ts';
import type { Storage } from '../storage/db.ts';
import { failPendingRecord, insertRequestRecord, type RequestRow } from '../storage/requests.ts';
import { chargeRequest, MERCHANT_ONLY_PRICING, meterPricing, type ChargeOutcome } from './charge.ts';
import { insertHold, releaseHoldInTransaction } from './holds.ts';
import { availableOf, lockWallets } from './wallets.ts';

/** Who pays what for a forwarded request, by billing mode. */
export function pricingFor(billing: BillingContext): { pricing: MeterPricing; walletId: string; meterPriced: boolean } {
  const walletId = billing.connection?.wallet_id ?? billing.merchantWalletId;
  if (billing.spendKey && billing.connection) {
    // A spend key of a customer's wallet: the customer pays the provider's base cost, no fee.
    return { pricing: { ...MERCHANT_ONLY_PRICING, baseCostPayer: 'wallet' }, walletId, meterPriced: false };
  }
  if (billing.meter && billing.mode !== 'billing_disabled') {
    return { pricing: meterPricing(billing.meter), walletId, meterPriced: true };
  }
  // Gateway mode, metering-only and disabled billing: no fee; the merchant pays the base cost.
  return { pricing: MERCHANT_ONLY_PRICING, walletId: billing.merchantWalletId, meterPriced: false };
}

export type AdmitInput = {
  requestId: string;
  billing: BillingContext;
  walletId: string;
  estimate: { wallet: bigint; merchant: bigint };
  ttlMs: number;
  record: Pick<RequestRow, 'provider' | 'model' | 'endpoint' | 'provider_key_type'> & { metadata: Record<string, string> };
  now?: Date;
};

export type AdmitOutcome =
  | { outcome: 'admitted'; recordId: string; holdIds: string[] }
  | { outcome: 'insufficient_balance'; payer: 'wallet' | 'merchant' }
  | { outcome: 'spend_key_refused'; error: ApiError };

/**
 * Holds the estimate on each paying wallet and writes the pending record, in one transaction.
 * Refused (nothing written) when a paying wallet's available balance cannot cover its part, or
 * when a wallet that would pay anything is at or below zero.
 */
export async function admitRequest(storage: Storage, input: AdmitInput): Promise<AdmitOutcome> {
  const now = input.now ?? new Date();
  return storage.db.transaction().execute(async (trx) => {
    const wallets = await lockWallets(trx, storage.dialect, [input.walletId, input.billing.merchantWalletId]);
    const parts = holdParts(input.walletId, input.billing.merchantWalletId, input.estimate);
    for (const part of parts) {
      const wallet = wallets.get(part.walletId)!;
      const available = availableOf(wallet);
      if (available < part.amount || available <= 0n) return { outcome: 'insufficient_balance', payer: part.payer };
    }
    const recordId = input.requestId;
    if (input.billing.spendKey) {
      const amount = input.estimate.wallet + input.estimate.merchant;
      const refusal = await reserveForRequest(trx, storage.dialect, {
        keyId: input.billing.spendKey.id,
        keyHash: input.billing.spendKey.key_hash,
        recordId,
        amount,
        now,
      });
      if (refusal) return { outcome: 'spend_key_refused', error: refusal };
    }
    const holdIds: string[] = [];
    for (const part of parts) {
      if (part.amount > 0n) {
        holdIds.push(await insertHold(trx, wallets.get(part.walletId)!, part.amount, recordId, input.ttlMs, now));
      }
    }
    await insertRequestRecord(trx, pendingRecord(input, recordId, now.toISOString()));
    return { outcome: 'admitted', recordId, holdIds };
  });
}

type HoldPart = { walletId: string; amount: bigint; payer: 'wallet' | 'merchant' };

/** The holds to place; a wallet only counts as paying when its part of the estimate is above zero. */
function holdParts(walletId: string, merchantWalletId: string, estimate: { wallet: bigint; merchant: bigint }): HoldPart[] {
  if (walletId === merchantWalletId) {
    const amount = estimate.wallet + estimate.merchant;
    return amount > 0n ? [{ walletId, amount, payer: 'merchant' }] : [];
  }
  const parts: HoldPart[] = [];
  if (estimate.wallet > 0n) parts.push({ walletId, amount: estimate.wallet, payer: 'wallet' });
  if (estimate.merchant > 0n) parts.push({ walletId: merchantWalletId, amount: estimate.merchant, payer: 'merchant' });
  return parts;
}

function pendingRecord(input: AdmitInput, id: string, at: string): RequestRow {
  const { pricing } = pricingFor(input.billing);
  return {
    id,
    merchant_id: input.billing.merchantId,
    request_id: id,
    body_hash: null,
    status: 'pending',
    connection_id: input.billing.connection?.id ?? null,
    meter_id: input.billing.meter?.id ?? null,
    provider: input.record.provider,
    model: input.record.model,
    endpoint: input.record.endpoint,
    provider_key_type: input.record.provider_key_type,
    response_id: null,
    provider_timestamp: null,
    metadata: JSON.stringify(input.record.metadata),
    input_tokens: 0n,
    output_tokens: 0n,
    input_characters: 0n,
    output_characters: 0n,
    input_seconds: '0',
    output_seconds: '0',
    input_cost: 0n,
    output_cost: 0n,
    base_cost_charged: 0,
    base_cost_payer: pricing.baseCostPayer,
    fee_amount: 0n,
    rate_type: pricing.rateType,
    token_basis: pricing.tokenBasis,
    breakdown: '[]',
    service_charge_amount: 0n,
    service_charge_payer: pricing.serviceChargePayer,
    total_request_cost: 0n,
    total_wallet_cost: 0n,
    total_merchant_cost: 0n,
    usage_estimated: 0,
    created_at: at,
    completed_at: null,
  };
}

export type SettleInput = {
  recordId: string;
  holdIds: string[];
  billing: BillingContext;
  usage: Usage;
  model: string | null;
  prices: BasePrices | null;
  baseCostCharged: boolean;
  serviceChargeRate: bigint;
  responseId: string | null;
  usageEstimated: boolean;
};

/** Charges the actual cost of a completed forwarded request and completes its pending record. */
export async function settleRequest(storage: Storage, input: SettleInput): Promise<ChargeOutcome> {
  const pending = await storage.db.selectFrom('requests').selectAll().where('id', '=', input.recordId).executeTakeFirst();
  if (!pending || pending.status !== 'pending') return { outcome: 'duplicate' };
  const { pricing, meterPriced } = pricingFor(input.billing);
  const outcome = await chargeRequest(storage, {
    merchant: { id: input.billing.merchantId, wallet_id: input.billing.merchantWalletId },
    connection: input.billing.connection,
    meter: input.billing.meter,
    ...(meterPriced ? {} : { pricing }),
    requestId: pending.request_id,
    bodyHash: null,
    usage: input.usage,
    provider: pending.provider,
    model: input.model,
    endpoint: pending.endpoint,
    providerKeyType: pending.provider_key_type,
    basePrices: input.prices,
    baseCostCharged: input.baseCostCharged,
    serviceChargeRate: input.serviceChargeRate,
    metadata: JSON.parse(pending.metadata) as Record<string, string>,
    responseId: input.responseId,
    providerTimestamp: new Date().toISOString(),
    usageEstimated: input.usageEstimated,
    holdIds: input.holdIds,
    pendingRecordId: input.recordId,
  });
  if (input.billing.spendKey && outcome.outcome !== 'duplicate') {
    const spend = outcome.outcome === 'recorded' ? outcome.priced.totals.wallet + outcome.priced.totals.merchant : 0n;
    await settleReservation(storage, input.recordId, spend);
  }
  return outcome;
}

/** The upstream failed (or the hold expired): release the holds, record `error`, charge nothing. */
export async function failRequest(storage: Storage, input: { recordId: string; holdIds: string[] }): Promise<void> {
  await storage.db.transaction().execute(async (trx) => {
    const holds = input.holdIds.length
      ? await trx.selectFrom('holds').select(['id', 'wallet_id']).where('id', 'in', input.holdIds).execute()
      : [];
    // No holds (a zero estimate, or an expired hold's sweep): nothing to lock, and PostgreSQL
    // rejects the empty `in ()` lockWallets would send.
    const wallets = holds.length ? await lockWallets(trx, storage.dialect, holds.map((h) => h.wallet_id)) : new Map();
    for (const hold of holds) await releaseHoldInTransaction(trx, hold.id, 'released', wallets);
    await failPendingRecord(trx, input.recordId, new Date().toISOString());
    await finishReservation(trx, storage.dialect, input.recordId, 0n);
  });
}
