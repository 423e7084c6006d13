import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import { deserializeTiers } from '../domain/meters.ts';
import { formatMoney, MAX_AMOUNT_UNITS } from '../domain/money.ts';
import {
  baseCost,
  priceRequest,
  type BasePrices,
  type MeterPricing,
  type PricedRequest,
  type Usage,
} from '../domain/pricing.ts';
import type { ConnectionRow } from '../storage/connections.ts';
import type { Storage } from '../storage/db.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import type { MerchantRow } from '../storage/merchants.ts';
import type { MeterRow } from '../storage/meters.ts';
import { completePendingRecord, insertRequestRecord, type RequestRow } from '../storage/requests.ts';
import type { Database } from '../storage/schema.ts';
import { merchantRevenueAccount, providerCostsAccount, serviceChargesAccount } from './accounts.ts';
import { recordWalletBalanceEvent } from './events.ts';
import { releaseHoldInTransaction } from './holds.ts';
import { appendTransaction, type Leg } from './postings.ts';
import { applyDebit, availableOf, lockWallets } from './wallets.ts';

export type ChargeInput = {
  merchant: Pick<MerchantRow, 'id' | 'wallet_id'>;
  /** Null for forwarded traffic billed to the merchant alone: the "wallet" parts fall to the merchant wallet. */
  connection: Pick<ConnectionRow, 'id' | 'wallet_id'> | null;
  /** Null when no meter prices the request (gateway mode): no fee, the merchant pays the base cost. */
  meter: MeterRow | null;
  /** Overrides the meter's pricing (billing disabled: attributed to the meter, priced as merchant-only). */
  pricing?: MeterPricing;
  /** The caller's id for the request (unique per merchant). */
  requestId: string;
  bodyHash: string | null;
  usage: Usage;
  provider: string;
  model: string | null;
  endpoint: string;
  providerKeyType: RequestRow['provider_key_type'];
  basePrices: BasePrices | null;
  /** Default: charged when prices are known and the provider key is ours (managed). */
  baseCostCharged?: boolean;
  serviceChargeRate: bigint;
  metadata: Record<string, string>;
  responseId?: string | null;
  providerTimestamp?: string | null;
  usageEstimated?: boolean;
  /**
   * A forwarded request settles against the hold placed at admission: the hold is released and the
   * actual cost charged even if it exceeds what is available. Without a hold (POST /requests) a
   * charge that the paying wallets cannot cover is refused and nothing is written.
   */
  holdId?: string;
  holdIds?: string[];
  /** Completes the pending record written at admission instead of inserting a new one. */
  pendingRecordId?: string;
  now?: Date;
};

/** Pricing of traffic no meter prices: no fee, no service charge, the merchant pays the base cost. */
export const MERCHANT_ONLY_PRICING: MeterPricing = {
  rateType: 'fixed',
  tierType: 'tokens_1m',
  tokenBasis: 'input+output',
  baseCostPayer: 'merchant',
  serviceChargePayer: 'merchant',
  tiers: [{ start: 0, rate: 0n }],
};

export type ChargeOutcome =
  | { outcome: 'recorded'; row: RequestRow; priced: PricedRequest }
  | { outcome: 'insufficient_balance'; payer: 'wallet' | 'merchant'; needed: bigint; available: bigint }
  | { outcome: 'duplicate' }
  | { outcome: 'amount_too_large' };

class AmountTooLarge extends Error {}

/** The hold a settlement names is not active (already settled, released or expired): charge nothing. */
class HoldNotActive extends Error {}

export class InsufficientBalance extends Error {
  constructor(
    readonly payer: 'wallet' | 'merchant',
    readonly needed: bigint,
    readonly available: bigint,
  ) {
    super('insufficient balance');
  }
}

/**
 * Prices one request and records it, charging the paying wallets, in a single transaction:
 * the tier position, the balances, the ledger, the record and the usage rollup all change together
 * or not at all.
 */
export async function chargeRequest(storage: Storage, input: ChargeInput): Promise<ChargeOutcome> {
  try {
    return await storage.db.transaction().execute((trx) => chargeInTransaction(trx, storage.dialect, input));
  } catch (e) {
    if (e instanceof InsufficientBalance) {
      return { outcome: 'insufficient_balance', payer: e.payer, needed: e.needed, available: e.available };
    }
    if (isUniqueViolation(e)) return { outcome: 'duplicate' };
    if (e instanceof AmountTooLarge) return { outcome: 'amount_too_large' };
    // Settlement happens once per hold: a second attempt is a duplicate, whatever its request id.
    if (e instanceof HoldNotActive) return { outcome: 'duplicate' };
    throw e;
  }
}

async function chargeInTransaction(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  input: ChargeInput,
): Promise<ChargeOutcome> {
  const now = input.now ?? new Date();
  const at = now.toISOString();
  const pricing = input.pricing ?? (input.meter ? meterPricing(input.meter) : MERCHANT_ONLY_PRICING);
  // Tier positions exist only where a meter's own pricing applies.
  const counter =
    input.meter && !input.pricing
      ? { meterId: input.meter.id, connectionId: input.connection?.id ?? '', periodStart: monthStart(now) }
      : null;
  const accumulated = counter ? await lockUsageCounter(trx, dialect, counter) : 0n;

  const base = input.basePrices
    ? baseCost(input.basePrices, { inputTokens: input.usage.inputTokens, outputTokens: input.usage.outputTokens })
    : { input: 0n, output: 0n, total: 0n };
  const priced = priceRequest({
    meter: pricing,
    usage: input.usage,
    baseCost: base,
    accumulatedUnits: accumulated,
    serviceChargeRate: input.serviceChargeRate,
    baseCostCharged: input.baseCostCharged ?? (input.basePrices !== null && input.providerKeyType === 'managed'),
  });

  if (priced.totals.request > MAX_AMOUNT_UNITS || priced.baseCost.total > MAX_AMOUNT_UNITS) throw new AmountTooLarge();

  const payerWalletId = input.connection?.wallet_id ?? input.merchant.wallet_id;
  const wallets = await lockWallets(trx, dialect, [payerWalletId, input.merchant.wallet_id]);
  const holdIds = [...(input.holdId ? [input.holdId] : []), ...(input.holdIds ?? [])];
  for (const holdId of holdIds) {
    if (!(await releaseHoldInTransaction(trx, holdId, 'settled', wallets))) throw new HoldNotActive();
  }
  const customerWallet = wallets.get(payerWalletId)!;
  const merchantWallet = wallets.get(input.merchant.wallet_id)!;
  if (holdIds.length === 0) {
    const sameWallet = customerWallet === merchantWallet;
    assertCovers(availableOf(customerWallet), priced.totals.wallet + (sameWallet ? priced.totals.merchant : 0n), 'wallet');
    if (!sameWallet) assertCovers(availableOf(merchantWallet), priced.totals.merchant, 'merchant');
  }

  const requestPk = input.pendingRecordId ?? newId('request');
  const legs: Leg[] = [
    ...(await applyDebit(trx, customerWallet, priced.totals.wallet)),
    ...(await applyDebit(trx, merchantWallet, priced.totals.merchant)),
    { account: providerCostsAccount(input.merchant.id), amount: priced.baseCost.charged ? priced.baseCost.total : 0n },
    { account: merchantRevenueAccount(input.merchant.id), amount: priced.fee.amount },
    { account: serviceChargesAccount(), amount: priced.serviceCharge.amount },
  ];
  await appendTransaction(trx, {
    kind: 'request_charge',
    merchantId: input.merchant.id,
    reference: requestPk,
    description: `Request ${input.requestId}`,
    legs,
    at,
  });
  if (counter) await saveUsageCounter(trx, counter, priced.accumulatedUnits);

  const record: RequestRow = {
    id: requestPk,
    merchant_id: input.merchant.id,
    request_id: input.requestId,
    body_hash: input.bodyHash,
    status: 'completed',
    connection_id: input.connection?.id ?? null,
    meter_id: input.meter?.id ?? null,
    provider: input.provider,
    model: input.model,
    endpoint: input.endpoint,
    provider_key_type: input.providerKeyType,
    response_id: input.responseId ?? null,
    provider_timestamp: input.providerTimestamp ?? null,
    metadata: JSON.stringify(input.metadata),
    input_tokens: BigInt(input.usage.inputTokens),
    output_tokens: BigInt(input.usage.outputTokens),
    input_characters: BigInt(input.usage.inputCharacters),
    output_characters: BigInt(input.usage.outputCharacters),
    input_seconds: input.usage.inputSeconds,
    output_seconds: input.usage.outputSeconds,
    input_cost: priced.baseCost.input,
    output_cost: priced.baseCost.output,
    base_cost_charged: priced.baseCost.charged ? 1 : 0,
    base_cost_payer: priced.baseCost.payer,
    fee_amount: priced.fee.amount,
    rate_type: priced.fee.rateType,
    token_basis: priced.fee.tokenBasis,
    breakdown: JSON.stringify(
      priced.fee.breakdown.map((b) => ({
        tier: { start: b.tier.start, rate: formatMoney(b.tier.rate), type: b.tier.type },
        tokens: b.tokens,
        characters: b.characters,
        seconds: Number(b.seconds),
        cost: formatMoney(b.cost),
      })),
    ),
    service_charge_amount: priced.serviceCharge.amount,
    service_charge_payer: priced.serviceCharge.payer,
    total_request_cost: priced.totals.request,
    total_wallet_cost: priced.totals.wallet,
    total_merchant_cost: priced.totals.merchant,
    usage_estimated: input.usageEstimated ? 1 : 0,
    created_at: at,
    completed_at: at,
  };
  const row = input.pendingRecordId
    ? await completePendingRecord(trx, record)
    : await insertRequestRecord(trx, record);

  const changedWallets = new Set([
    ...(priced.totals.wallet !== 0n || holdIds.length > 0 ? [customerWallet] : []),
    ...(priced.totals.merchant !== 0n || holdIds.length > 0 ? [merchantWallet] : []),
  ]);
  for (const wallet of changedWallets) {
    const connectionId = wallet === customerWallet ? (input.connection?.id ?? null) : null;
    await recordWalletBalanceEvent(trx, wallet, connectionId, at);
  }
  return { outcome: 'recorded', row, priced };
}

function assertCovers(available: bigint, needed: bigint, payer: 'wallet' | 'merchant'): void {
  if (needed === 0n) return;
  if (available < needed) throw new InsufficientBalance(payer, needed, available);
}

export function meterPricing(meter: MeterRow): MeterPricing {
  return {
    rateType: meter.rate_type,
    tierType: meter.tier_type,
    tokenBasis: meter.token_basis,
    baseCostPayer: meter.base_cost_payer,
    serviceChargePayer: meter.service_charge_payer,
    tiers: deserializeTiers(meter.tiers),
  };
}

/** Tiers accumulate over the UTC calendar month until subscriptions define a cycle. */
export function monthStart(now: Date): string {
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)).toISOString();
}

type CounterKey = { meterId: string; connectionId: string; periodStart: string };

/**
 * Reads the (meter, connection) position for the period and locks it until the transaction ends,
 * so two concurrent requests can never price at the same tier position.
 */
async function lockUsageCounter(trx: Transaction<Database>, dialect: Storage['dialect'], key: CounterKey): Promise<bigint> {
  await trx
    .insertInto('meter_usage_counters')
    .values({ meter_id: key.meterId, connection_id: key.connectionId, period_start: key.periodStart, units: 0n })
    .onConflict((oc) => oc.columns(['meter_id', 'connection_id', 'period_start']).doNothing())
    .execute();
  const row = await trx
    .selectFrom('meter_usage_counters')
    .select('units')
    .where('meter_id', '=', key.meterId)
    .where('connection_id', '=', key.connectionId)
    .where('period_start', '=', key.periodStart)
    .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
    .executeTakeFirstOrThrow();
  return BigInt(row.units);
}

async function saveUsageCounter(trx: Transaction<Database>, key: CounterKey, units: bigint): Promise<void> {
  await trx
    .updateTable('meter_usage_counters')
    .set({ units })
    .where('meter_id', '=', key.meterId)
    .where('connection_id', '=', key.connectionId)
    .where('period_start', '=', key.periodStart)
    .execute();
}
