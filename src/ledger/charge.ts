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
import { BalanceChanges } from './events.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';
import { releaseHoldInTransaction } from './holds.ts';
import { appendTransaction, type LedgerTransactionInput, type Leg } from './postings.ts';
import { availableFor, availableOf, debitInMemory, lockWallets, saveBalance, type UnwrittenHolds, type WalletRow } from './wallets.ts';
import { overrunWallets } from './admission/decision.ts';
import { counterAt, counterId, counterKeyOf, lockUsageCounters, saveUsageCounters } from './tier-counters.ts';

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
  /** The model the request named, when the provider served it under another name. */
  requestedModel?: string | null;
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
  /**
   * The customer's usage is on a meter linked to the plan of its live subscription: it draws cycle
   * credit, then bundle credit, then the prepaid balance. Absent or false: the prepaid balance
   * only, and only that is available to it (decision 0016). A charge batch (POST /requests)
   * decides it itself, under its locks.
   */
  drawsPlanCredit?: boolean;
  /** When the request was admitted, for a record written first at admission (default: the charge's time). */
  createdAt?: string;
  /** The app's holds admitted in process and not written yet (SQLite), which a charge without a hold must leave. */
  unwritten?: UnwrittenHolds;
  now: Date;
};

/**
 * The time a batch of charges (or settlements, or failures) is written at: its newest member's.
 * Each member takes its time from the app's clock when it is handed in.
 */
export function batchTime(inputs: readonly { now: Date }[]): Date {
  let latest: Date | undefined;
  for (const input of inputs) if (!latest || input.now > latest) latest = input.now;
  if (!latest) throw new RangeError('a batch has at least one member');
  return latest;
}

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

class InsufficientBalance extends Error {
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
export async function chargeRequest(
  storage: Storage,
  input: ChargeInput,
  /** More writes that must commit with the charge (a spend key's reservation). */
  alsoInTransaction?: (trx: Transaction<Database>, charged: Extract<ChargeOutcome, { outcome: 'recorded' }>) => Promise<void>,
): Promise<ChargeOutcome> {
  try {
    return await storage.db.transaction().execute(async (trx) => {
      const charged = await chargeInTransaction(trx, storage.dialect, input);
      if (alsoInTransaction && charged.outcome === 'recorded') await alsoInTransaction(trx, charged);
      return charged;
    });
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
  const now = input.now;
  const at = now.toISOString();
  const counter = counterKeyOf(input, now);
  const accumulated = counter ? ((await lockUsageCounters(trx, dialect, [counter])).get(counterId(counter)) ?? 0n) : 0n;
  const priced = priceCharge(input, accumulated);
  if (priced === 'amount_too_large') throw new AmountTooLarge();

  const payerWalletId = payerWalletOf(input);
  const holdIds = [...(input.holdId ? [input.holdId] : []), ...(input.holdIds ?? [])];
  // The merchant's wallet is locked only when this charge touches it: every customer's request
  // names the same merchant wallet, so locking it always would queue them all behind one row.
  const touchesMerchantWallet = priced.totals.merchant !== 0n || holdIds.length > 0;
  const wallets = await lockWallets(trx, dialect, [payerWalletId, ...(touchesMerchantWallet ? [input.merchant.wallet_id] : [])]);
  const heldBefore = new Map([...wallets.values()].map((wallet) => [wallet, BigInt(wallet.held)]));
  for (const holdId of holdIds) {
    if (!(await releaseHoldInTransaction(trx, holdId, 'settled', wallets))) throw new HoldNotActive();
  }
  const customerWallet = wallets.get(payerWalletId)!;
  const merchantWallet = wallets.get(input.merchant.wallet_id);
  if (holdIds.length === 0) {
    const refusal = balanceShortfall(priced, customerWallet, merchantWallet, input);
    if (refusal) throw new InsufficientBalance(refusal.payer, refusal.needed, refusal.available);
  }

  const requestPk = input.pendingRecordId ?? newId('request');
  const { record, transaction } = postCharge(input, priced, requestPk, customerWallet, merchantWallet, at);
  for (const wallet of walletsDebitedBy(priced, customerWallet, merchantWallet)) await saveBalance(trx, wallet);
  await appendTransaction(trx, transaction);
  if (holdIds.length > 0 && merchantWallet) {
    // Charged beyond what it held: admissions count what its requests in flight may overrun (decision 0025).
    for (const [wallet, overrun] of overrunWallets(priced, customerWallet, merchantWallet, (wallet) => heldBefore.get(wallet)! - BigInt(wallet.held))) {
      await trx.updateTable('wallets').set({ overrun }).where('id', '=', wallet.id).execute();
    }
  }
  if (counter) await saveUsageCounters(trx, [counterAt(counter, priced.accumulatedUnits)]);

  const row = input.pendingRecordId
    ? await completePendingRecord(trx, dialect, record)
    : await insertRequestRecord(trx, dialect, record);

  const changes = new BalanceChanges();
  changes.noteCharge(input, priced, customerWallet, merchantWallet, holdIds.length > 0);
  for (const event of changes.events(at)) await enqueueEvent(trx, event);
  return { outcome: 'recorded', row, priced };
}

/** A charge posted in memory: the completed record and the ledger transaction that records its money. */
export type PostedCharge = { record: RequestRow; transaction: LedgerTransactionInput };

/**
 * Posts a priced charge on its locked wallets, in memory: debits them bucket by bucket, splits the
 * amount into ledger legs (chargeLegs: the wallets' debits, provider costs, merchant revenue,
 * service charges) and builds the ledger transaction and the completed record. Every way of
 * charging posts here, a single charge (chargeRequest), a batch of POST /requests
 * (charge-batch.ts) and a batch of forwarded requests' settlements (settlement/settle.ts); each
 * then writes the wallets (walletsDebitedBy), the record and the ledger rows in its own statements.
 */
export function postCharge(
  input: ChargeInput,
  priced: PricedRequest,
  requestPk: string,
  customerWallet: WalletRow,
  merchantWallet: WalletRow | undefined,
  at: string,
): PostedCharge {
  const debits = [
    ...debitInMemory(customerWallet, priced.totals.wallet, input.drawsPlanCredit ?? false),
    // A merchant's wallet has no plan credit.
    ...(merchantWallet ? debitInMemory(merchantWallet, priced.totals.merchant, false) : []),
  ];
  return {
    record: buildRequestRecord(input, priced, requestPk, at),
    transaction: chargeTransaction(input, requestPk, chargeLegs(input.merchant.id, chargeCreditsOf(priced), debits), at),
  };
}

/** The wallets a posted charge debited (one when the customer's is the merchant's). */
export function walletsDebitedBy(priced: PricedRequest, customerWallet: WalletRow, merchantWallet: WalletRow | undefined): WalletRow[] {
  const debited: WalletRow[] = [];
  if (priced.totals.wallet !== 0n) debited.push(customerWallet);
  if (merchantWallet && priced.totals.merchant !== 0n && !debited.includes(merchantWallet)) debited.push(merchantWallet);
  return debited;
}

/** The wallet that pays the "wallet" parts: the customer's, or the merchant's when there is no customer. */
export function payerWalletOf(input: Pick<ChargeInput, 'connection' | 'merchant'>): string {
  return input.connection?.wallet_id ?? input.merchant.wallet_id;
}

function pricingOf(input: ChargeInput): MeterPricing {
  return input.pricing ?? (input.meter ? meterPricing(input.meter) : MERCHANT_ONLY_PRICING);
}

function baseCostChargedOf(input: ChargeInput): boolean {
  return input.baseCostCharged ?? (input.basePrices !== null && input.providerKeyType === 'managed');
}

/**
 * Whether any price of this request can fall on the merchant's wallet: only the base cost and the
 * service charge can, when the meter names the merchant as their payer (the fee is always the
 * wallet's). Known before the tier position is, so a batch can lock just the wallets it may debit.
 */
export function mayChargeMerchantWallet(input: ChargeInput): boolean {
  const pricing = pricingOf(input);
  if (payerWalletOf(input) === input.merchant.wallet_id) return true;
  const baseOnMerchant = pricing.baseCostPayer === 'merchant' && input.basePrices !== null && baseCostChargedOf(input);
  const serviceChargeOnMerchant = pricing.serviceChargePayer === 'merchant' && input.serviceChargeRate > 0n;
  return baseOnMerchant || serviceChargeOnMerchant;
}

/** Prices the request at the given tier position; pure. */
export function priceCharge(input: ChargeInput, accumulated: bigint): PricedRequest | 'amount_too_large' {
  const base = input.basePrices
    ? baseCost(input.basePrices, input.usage)
    : { input: 0n, output: 0n, total: 0n };
  const priced = priceRequest({
    meter: pricingOf(input),
    usage: input.usage,
    baseCost: base,
    accumulatedUnits: accumulated,
    serviceChargeRate: input.serviceChargeRate,
    baseCostCharged: baseCostChargedOf(input),
  });
  if (priced.totals.request > MAX_AMOUNT_UNITS || priced.baseCost.total > MAX_AMOUNT_UNITS) return 'amount_too_large';
  return priced;
}

/** What a charge without a hold lacks: whose wallet, how much it needs and what it has available (a 402). */
export type BalanceShortfall = { payer: 'wallet' | 'merchant'; needed: bigint; available: bigint };

/**
 * Why the paying wallets cannot take this charge without a hold, or null when they can. The
 * merchant's wallet may be absent only when the merchant's part is zero. The customer's wallet
 * offers its plan credit only to usage that draws it (availableFor).
 */
export function balanceShortfall(
  priced: PricedRequest,
  customerWallet: WalletRow,
  merchantWallet: WalletRow | undefined,
  { unwritten, drawsPlanCredit }: Pick<ChargeInput, 'unwritten' | 'drawsPlanCredit'>,
): BalanceShortfall | null {
  const sameWallet = customerWallet === merchantWallet;
  const walletPart = priced.totals.wallet + (sameWallet ? priced.totals.merchant : 0n);
  const walletRefusal = shortfall(availableFor(customerWallet, unwritten, drawsPlanCredit ?? false), walletPart, 'wallet');
  if (walletRefusal || sameWallet || priced.totals.merchant === 0n) return walletRefusal;
  if (!merchantWallet) throw new Error('a charge on the merchant wallet without its lock');
  return shortfall(availableOf(merchantWallet, unwritten), priced.totals.merchant, 'merchant');
}

function shortfall(available: bigint, needed: bigint, payer: 'wallet' | 'merchant'): BalanceShortfall | null {
  if (needed === 0n || available >= needed) return null;
  return { payer, needed, available };
}

/** Where a charge's money goes besides the wallets it debits. */
export type ChargeCredits = { providerCost: bigint; merchantRevenue: bigint; serviceCharge: bigint };

function chargeCreditsOf(priced: PricedRequest): ChargeCredits {
  return { providerCost: priced.baseCost.charged ? priced.baseCost.total : 0n, merchantRevenue: priced.fee.amount, serviceCharge: priced.serviceCharge.amount };
}

/** A charge's ledger legs: the wallets' debits, and provider costs, merchant revenue and service charges credited. */
export function chargeLegs(merchantId: string, credits: ChargeCredits, walletDebits: Leg[]): Leg[] {
  return [
    ...walletDebits,
    { account: providerCostsAccount(merchantId), amount: credits.providerCost },
    { account: merchantRevenueAccount(merchantId), amount: credits.merchantRevenue },
    { account: serviceChargesAccount(), amount: credits.serviceCharge },
  ];
}

/** A priced request's tier breakdown as the request record stores it (amounts as decimal strings). */
export function breakdownJson(priced: PricedRequest): string {
  return JSON.stringify(
    priced.fee.breakdown.map((b) => ({
      tier: { start: b.tier.start, rate: formatMoney(b.tier.rate), type: b.tier.type },
      tokens: b.tokens,
      characters: b.characters,
      seconds: Number(b.seconds),
      cost: formatMoney(b.cost),
    })),
  );
}

function chargeTransaction(input: ChargeInput, requestPk: string, legs: Leg[], at: string): LedgerTransactionInput {
  return {
    kind: 'request_charge',
    merchantId: input.merchant.id,
    reference: requestPk,
    description: `Request ${input.requestId}`,
    legs,
    at,
  };
}

function buildRequestRecord(input: ChargeInput, priced: PricedRequest, requestPk: string, at: string): RequestRow {
  const identity: RecordIdentity = {
    id: requestPk,
    merchant_id: input.merchant.id,
    request_id: input.requestId,
    body_hash: input.bodyHash,
    connection_id: input.connection?.id ?? null,
    meter_id: input.meter?.id ?? null,
    provider: input.provider,
    model: input.model,
    requested_model: input.requestedModel ?? null,
    endpoint: input.endpoint,
    provider_key_type: input.providerKeyType,
    response_id: input.responseId ?? null,
    provider_timestamp: input.providerTimestamp ?? null,
    metadata: JSON.stringify(input.metadata),
    created_at: input.createdAt ?? at,
  };
  return completedRequestRow(identity, input.usage, priced, input.usageEstimated ?? false, at);
}

/** The columns of a completed record that name it; the others follow from its usage and price. */
export type RecordIdentity = Pick<
  RequestRow,
  | 'id'
  | 'merchant_id'
  | 'request_id'
  | 'body_hash'
  | 'connection_id'
  | 'meter_id'
  | 'provider'
  | 'model'
  | 'requested_model'
  | 'endpoint'
  | 'provider_key_type'
  | 'response_id'
  | 'provider_timestamp'
  | 'metadata'
  | 'created_at'
>;

/**
 * A completed request record, as both ways of charging write it (POST /requests and the forward
 * gateway's settlement). One literal, column by column: no spread on this path (decision 0008).
 */
function completedRequestRow(identity: RecordIdentity, usage: Usage, priced: PricedRequest, usageEstimated: boolean, completedAt: string): RequestRow {
  return {
    id: identity.id,
    merchant_id: identity.merchant_id,
    request_id: identity.request_id,
    body_hash: identity.body_hash,
    status: 'completed',
    connection_id: identity.connection_id,
    meter_id: identity.meter_id,
    provider: identity.provider,
    model: identity.model,
    requested_model: identity.requested_model,
    endpoint: identity.endpoint,
    provider_key_type: identity.provider_key_type,
    response_id: identity.response_id,
    provider_timestamp: identity.provider_timestamp,
    metadata: identity.metadata,
    input_tokens: BigInt(usage.inputTokens),
    output_tokens: BigInt(usage.outputTokens),
    cached_input_tokens: BigInt(usage.cachedInputTokens ?? 0),
    cache_write_input_tokens: BigInt(usage.cacheWriteInputTokens ?? 0),
    reasoning_tokens: BigInt(usage.reasoningTokens ?? 0),
    output_images: BigInt(usage.outputImages ?? 0),
    price_unit: priced.baseCost.unit,
    input_characters: BigInt(usage.inputCharacters),
    output_characters: BigInt(usage.outputCharacters),
    input_seconds: usage.inputSeconds,
    output_seconds: usage.outputSeconds,
    input_cost: priced.baseCost.input,
    output_cost: priced.baseCost.output,
    base_cost_charged: priced.baseCost.charged ? 1 : 0,
    base_cost_payer: priced.baseCost.payer,
    fee_amount: priced.fee.amount,
    rate_type: priced.fee.rateType,
    token_basis: priced.fee.tokenBasis,
    breakdown: breakdownJson(priced),
    service_charge_amount: priced.serviceCharge.amount,
    service_charge_payer: priced.serviceCharge.payer,
    total_request_cost: priced.totals.request,
    total_wallet_cost: priced.totals.wallet,
    total_merchant_cost: priced.totals.merchant,
    usage_estimated: usageEstimated ? 1 : 0,
    created_at: identity.created_at,
    completed_at: completedAt,
  };
}

/** Parsed once per meter row read: every request of a batch shares its meter's row. */
const pricingOfRow = new WeakMap<MeterRow, MeterPricing>();

export function meterPricing(meter: MeterRow): MeterPricing {
  let pricing = pricingOfRow.get(meter);
  if (!pricing) {
    pricing = parseMeterPricing(meter);
    pricingOfRow.set(meter, pricing);
  }
  return pricing;
}

function parseMeterPricing(meter: MeterRow): MeterPricing {
  return {
    rateType: meter.rate_type,
    tierType: meter.tier_type,
    tokenBasis: meter.token_basis,
    baseCostPayer: meter.base_cost_payer,
    serviceChargePayer: meter.service_charge_payer,
    tiers: deserializeTiers(meter.tiers),
  };
}
