import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import { formatMoney } from '../domain/money.ts';
import type { PricedRequest, Usage } from '../domain/pricing.ts';
import type { Storage } from '../storage/db.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { completePendingRecord, insertRequestRecord, type RequestRow } from '../storage/requests.ts';
import type { Database } from '../storage/schema.ts';
import { BalanceChanges } from './events.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';
import { releaseHoldInTransaction } from './holds.ts';
import type { LedgerTransactionInput, Leg } from './postings.ts';
import { appendTransaction } from './store/common.ts';
import { lockWallets, saveBalance, type WalletRow } from './wallets.ts';
import { debitInMemory, drawsPlanCredit } from './decide/balance.ts';
import {
  balanceShortfall,
  chargeCreditsOf,
  chargeLegs,
  overrunWallets,
  payerWalletOf,
  priceCharge,
  walletsDebitedBy,
  type ChargeInput,
} from './decide/charge.ts';
import { counterAt, counterId, counterKeyOf, lockUsageCounters, saveUsageCounters } from './tier-counters.ts';

/** The charge's facts and its shortfall are decided in decide/charge.ts; callers of a charge name them here. */
export type { BalanceShortfall, ChargeInput } from './decide/charge.ts';

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
    ...debitInMemory(customerWallet, priced.totals.wallet, drawsPlanCredit(input)),
    // A merchant's wallet has no plan credit.
    ...(merchantWallet ? debitInMemory(merchantWallet, priced.totals.merchant, false) : []),
  ];
  return {
    record: buildRequestRecord(input, priced, requestPk, at),
    transaction: chargeTransaction(input, requestPk, chargeLegs(input.merchant.id, chargeCreditsOf(priced), debits), at),
  };
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

