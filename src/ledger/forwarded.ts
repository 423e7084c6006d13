/**
 * The money side of a forwarded request: admit (hold + pending record), then settle (charge the
 * actual cost against the holds) or fail (release the holds, record `error`, charge nothing).
 */
import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { MeterPricing, Usage, BasePrices } from '../domain/pricing.ts';
import type { BillingContext } from '../gateway/credentials.ts';
import { RunAlone, type BatchJob } from '../gateway/writer.ts';
import { finishReservation, reserveForRequest, settleReservation } from '../gateway/spend-key-guard.ts';
import type { ApiError } from '../http/errors.ts';
import type { Storage } from '../storage/db.ts';
import type { MeterRow } from '../storage/meters.ts';
import type { Database } from '../storage/schema.ts';
import { failPendingRecord, insertRequestRecord, type RequestRow } from '../storage/requests.ts';
import { chargeRequest, MERCHANT_ONLY_PRICING, meterPricing, type ChargeInput, type ChargeOutcome } from './charge.ts';
import { insertHold, releaseHoldInTransaction } from './holds.ts';
import { availableOf, lockWallets, type WalletRow } from './wallets.ts';

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

/** Who pays what for a forwarded request, by billing mode. */
export function pricingFor(billing: BillingContext): { pricing: MeterPricing; walletId: string; meterPriced: boolean } {
  const walletId = billing.connection?.wallet_id ?? billing.merchantWalletId;
  if (billing.spendKey && billing.connection) {
    // A spend key of a customer's wallet: the customer pays the provider's base cost, no fee.
    return { pricing: { ...MERCHANT_ONLY_PRICING, baseCostPayer: 'wallet' }, walletId, meterPriced: false };
  }
  if (billing.meter && billing.mode !== 'billing_disabled') {
    return { pricing: cachedMeterPricing(billing.meter), walletId, meterPriced: true };
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

/**
 * admitRequest for several requests in one transaction (group commit): the same decisions, taken
 * in the order given against the wallets as each earlier request left them, with each table
 * written once. Only the wallets that take a hold are locked (every customer's request names the
 * merchant's wallet; locking it always would queue them all behind one row), then the spend keys,
 * both in id order. A refusal changes nothing of its own request; the others go on.
 */
export async function admitBatch(storage: Storage, inputs: AdmitInput[]): Promise<AdmitOutcome[]> {
  return storage.db.transaction().execute((trx) => admitInTransaction(trx, storage.dialect, inputs));
}

export async function admitInTransaction(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  inputs: AdmitInput[],
): Promise<AdmitOutcome[]> {
  const partsOf = inputs.map((input) => holdParts(input.walletId, input.billing.merchantWalletId, input.estimate));
  const walletIds = partsOf.flatMap((parts) => parts.map((p) => p.walletId));
  const wallets = walletIds.length > 0 ? await lockWallets(trx, dialect, walletIds) : new Map<string, WalletRow>();
  const keyIds = [...new Set(inputs.flatMap((input) => (input.billing.spendKey ? [input.billing.spendKey.id] : [])))].sort();
  if (keyIds.length > 0) {
    await trx
      .selectFrom('spend_keys')
      .select('id')
      .where('id', 'in', keyIds)
      .orderBy('id')
      .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
      .execute();
  }

  const outcomes: AdmitOutcome[] = [];
  const holds: { id: string; wallet_id: string; reference: string; amount: bigint; status: 'active'; created_at: string; expires_at: string }[] = [];
  const records: RequestRow[] = [];
  const changed = new Set<WalletRow>();
  for (const [i, input] of inputs.entries()) {
    const parts = partsOf[i]!;
    const now = input.now ?? new Date();
    const refused = parts.find((part) => {
      const available = availableOf(wallets.get(part.walletId)!);
      return available < part.amount || available <= 0n;
    });
    if (refused) {
      outcomes.push({ outcome: 'insufficient_balance', payer: refused.payer });
      continue;
    }
    const recordId = input.requestId;
    if (input.billing.spendKey) {
      const refusal = await reserveForRequest(trx, dialect, {
        keyId: input.billing.spendKey.id,
        keyHash: input.billing.spendKey.key_hash,
        recordId,
        amount: input.estimate.wallet + input.estimate.merchant,
        now,
      });
      if (refusal) {
        outcomes.push({ outcome: 'spend_key_refused', error: refusal });
        continue;
      }
    }
    const holdIds: string[] = [];
    const createdAt = now.toISOString();
    const expiresAt = new Date(now.getTime() + input.ttlMs).toISOString();
    for (const part of parts) {
      const wallet = wallets.get(part.walletId)!;
      const id = newId('hold');
      holds.push({ id, wallet_id: wallet.id, reference: recordId, amount: part.amount, status: 'active', created_at: createdAt, expires_at: expiresAt });
      wallet.held += part.amount;
      changed.add(wallet);
      holdIds.push(id);
    }
    records.push(pendingRecord(input, recordId, createdAt));
    outcomes.push({ outcome: 'admitted', recordId, holdIds });
  }

  if (holds.length > 0) await trx.insertInto('holds').values(holds).execute();
  for (const wallet of changed) await trx.updateTable('wallets').set({ held: wallet.held }).where('id', '=', wallet.id).execute();
  if (records.length > 0) {
    await trx.insertInto('requests').values(records).execute();
    const metadata = records.flatMap((row) =>
      Object.entries(JSON.parse(row.metadata) as Record<string, string>).map(([key, value]) => ({
        request_pk: row.id,
        merchant_id: row.merchant_id,
        key,
        value,
        created_at: row.created_at,
      })),
    );
    if (metadata.length > 0) await trx.insertInto('request_metadata').values(metadata).execute();
  }
  return outcomes;
}

/** Admission as a group-commit job (gateway/writer.ts). */
export const ADMIT_JOB: BatchJob<AdmitInput, AdmitOutcome> = {
  order: 1,
  inTransaction: admitInTransaction,
  alone: admitRequest,
};

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
  /**
   * What the pending record already says (known to the caller that admitted it). Without it the
   * pending record is read first.
   */
  record?: PendingFacts;
};

type PendingFacts = Pick<RequestRow, 'provider' | 'endpoint' | 'provider_key_type'> & { metadata: Record<string, string> };

function chargeInputOf(input: SettleInput, pending: PendingFacts): ChargeInput {
  const { pricing, meterPriced } = pricingFor(input.billing);
  return {
    merchant: { id: input.billing.merchantId, wallet_id: input.billing.merchantWalletId },
    connection: input.billing.connection,
    meter: input.billing.meter,
    ...(meterPriced ? {} : { pricing }),
    // Forwarded records use their id as request_id.
    requestId: input.recordId,
    bodyHash: null,
    usage: input.usage,
    provider: pending.provider,
    model: input.model,
    endpoint: pending.endpoint,
    providerKeyType: pending.provider_key_type,
    basePrices: input.prices,
    baseCostCharged: input.baseCostCharged,
    serviceChargeRate: input.serviceChargeRate,
    metadata: pending.metadata,
    responseId: input.responseId,
    providerTimestamp: new Date().toISOString(),
    usageEstimated: input.usageEstimated,
    holdIds: input.holdIds,
    pendingRecordId: input.recordId,
  };
}

const spendOf = (outcome: ChargeOutcome): bigint =>
  outcome.outcome === 'recorded' ? outcome.priced.totals.wallet + outcome.priced.totals.merchant : 0n;

/** Charges the actual cost of a completed forwarded request and completes its pending record. */
export async function settleRequest(storage: Storage, input: SettleInput): Promise<ChargeOutcome> {
  const pending = await storage.db.selectFrom('requests').selectAll().where('id', '=', input.recordId).executeTakeFirst();
  if (!pending || pending.status !== 'pending') return { outcome: 'duplicate' };
  const outcome = await chargeRequest(
    storage,
    chargeInputOf(input, { ...pending, metadata: JSON.parse(pending.metadata) as Record<string, string> }),
  );
  if (input.billing.spendKey && outcome.outcome !== 'duplicate') {
    await settleReservation(storage, input.recordId, spendOf(outcome));
  }
  return outcome;
}


/**
 * Settlements of several requests inside one (group-commit) transaction: each is the same charge
 * settleRequest makes, with its spend-key reservation finished in the same transaction. Anything
 * but a plain recorded charge (a duplicate, a refusal) rolls the whole batch back, and every member
 * is then settled alone by settleRequest, which knows how to answer it.
 */
async function settleInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: SettleInput[]): Promise<ChargeOutcome[]> {
  const shared = inTransaction(trx, dialect);
  const outcomes: ChargeOutcome[] = [];
  for (const input of inputs) {
    if (!input.record) throw new RunAlone();
    const outcome = await chargeRequest(shared, chargeInputOf(input, input.record));
    if (outcome.outcome !== 'recorded') throw new RunAlone();
    if (input.billing.spendKey) await finishReservation(trx, dialect, input.recordId, spendOf(outcome));
    outcomes.push(outcome);
  }
  return outcomes;
}

/**
 * A Storage whose transactions are the given one: lets a function that opens its own transaction
 * (chargeRequest) run inside a batch's. Its errors still reach the batch, which then rolls back.
 */
function inTransaction(trx: Transaction<Database>, dialect: Storage['dialect']): Storage {
  const db = { transaction: () => ({ execute: <T>(fn: (t: Transaction<Database>) => Promise<T>) => fn(trx) }) };
  return { db: db as unknown as Storage['db'], dialect, describe: 'batch transaction', close: async () => {} };
}

/** The upstream failed (or the hold expired): release the holds, record `error`, charge nothing. */
export async function failRequest(storage: Storage, input: FailInput): Promise<void> {
  await storage.db.transaction().execute((trx) => failInTransaction(trx, storage.dialect, [input]));
}

export type FailInput = { recordId: string; holdIds: string[] };

async function failInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: FailInput[]): Promise<void[]> {
  const at = new Date().toISOString();
  for (const input of inputs) {
    const holds = input.holdIds.length
      ? await trx.selectFrom('holds').select(['id', 'wallet_id']).where('id', 'in', input.holdIds).execute()
      : [];
    // No holds (a zero estimate, or an expired hold's sweep): nothing to lock, and PostgreSQL
    // rejects the empty `in ()` lockWallets would send.
    const wallets = holds.length ? await lockWallets(trx, dialect, holds.map((h) => h.wallet_id)) : new Map<string, WalletRow>();
    for (const hold of holds) await releaseHoldInTransaction(trx, hold.id, 'released', wallets);
    await failPendingRecord(trx, input.recordId, at);
    await finishReservation(trx, dialect, input.recordId, 0n);
  }
  return inputs.map(() => undefined);
}

/** Settlement and failure as group-commit jobs (gateway/writer.ts); they run before admissions. */
export const SETTLE_JOB: BatchJob<SettleInput, ChargeOutcome> = { order: 0, inTransaction: settleInTransaction, alone: settleRequest };
export const FAIL_JOB: BatchJob<FailInput, void> = { order: 0, inTransaction: failInTransaction, alone: failRequest };
