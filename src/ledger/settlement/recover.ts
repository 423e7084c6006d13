/**
 * Recovery of forwarded requests whose settlement never came (their instance crashed, or could not
 * write for a whole hold TTL): decision 0019. Such a request's provider call may have
 * been answered, so it is never made free: its pending record is completed with the charge its
 * hold was estimated for (an upper bound of what it could cost), flagged `usage_estimated`. Only a
 * record without an estimate (written before this was kept) is failed as before.
 */
import type { Transaction } from 'kysely';
import type { PricedRequest, Usage } from '../../domain/pricing.ts';
import { finishReservation } from '../spend-key-limits.ts';
import type { Storage } from '../../storage/db.ts';
import { completePendingRecord, failPendingRecord, type RequestRow } from '../../storage/requests.ts';
import { COUNTER_KEY, type Database } from '../../storage/schema.ts';
import { BalanceChanges } from '../events.ts';
import { breakdownJson } from '../charge.ts';
import { chargeLegs, type ChargeCredits } from '../decide/charge.ts';
import { enqueueEvent } from '../../webhooks/outbox.ts';
import { appendTransaction } from '../store/common.ts';
import { releaseHoldInTransaction } from '../holds.ts';
import { lockWallets, saveBalance, type WalletRow } from '../wallets.ts';
import { debitInMemory } from '../decide/balance.ts';
import { counterAt, counterId, counterRow, countersInKeyOrder, lockUsageCounters, monthStart, type CounterKey } from '../tier-counters.ts';
import { runWrites } from '../../storage/batch-write.ts';

/** What a hold was estimated from, kept on the pending record (`hold_estimate`, JSON; amounts as decimal strings of units). */
export type EstimatedCharge = {
  input_tokens: number;
  output_tokens: number;
  input_characters: number;
  input_cost: string;
  output_cost: string;
  base_cost_total: string;
  base_cost_charged: boolean;
  fee_amount: string;
  breakdown: string;
  service_charge_amount: string;
  total_request_cost: string;
  total_wallet_cost: string;
  total_merchant_cost: string;
  /** The request's fee units (accumulation units of its meter's tiers); absent on records kept before. */
  fee_units?: string;
};

/** The estimate a hold was priced from, as the pending record keeps it. */
export function estimatedChargeOf(usage: Usage, priced: PricedRequest): EstimatedCharge {
  return {
    input_tokens: usage.inputTokens,
    output_tokens: usage.outputTokens,
    input_characters: usage.inputCharacters,
    input_cost: String(priced.baseCost.input),
    output_cost: String(priced.baseCost.output),
    base_cost_total: String(priced.baseCost.total),
    base_cost_charged: priced.baseCost.charged,
    fee_amount: String(priced.fee.amount),
    breakdown: breakdownJson(priced),
    service_charge_amount: String(priced.serviceCharge.amount),
    total_request_cost: String(priced.totals.request),
    total_wallet_cost: String(priced.totals.wallet),
    total_merchant_cost: String(priced.totals.merchant),
    fee_units: String(priced.units),
  };
}

/**
 * `hold_estimate` as written at admission: the estimate, who pays it, and whether the payer's plan
 * credit pays it (BillingContext.drawsPlanCredit; absent on records written before it was kept:
 * prepaid only).
 */
export type KeptEstimate = EstimatedCharge & {
  payer_wallet_id: string;
  merchant_wallet_id: string;
  draws_plan_credit?: boolean;
  /** Priced by its meter's own tiers (BillingContext, pricingFor): its charge advances the tier position. */
  meter_priced?: boolean;
};

/**
 * The tier counter a recovered record advances, and by how much: as its settlement would have,
 * the (meter, customer) position for the month it is charged in. None for a record not priced by
 * its meter's tiers, or kept before its units were (it is charged without advancing, as before).
 */
function recoveredCounter(row: Pick<RequestRow, 'meter_id' | 'connection_id'>, estimate: KeptEstimate | null, at: string): (CounterKey & { units: bigint }) | null {
  if (!estimate?.meter_priced || estimate.fee_units === undefined || row.meter_id === null) return null;
  return counterAt({ meterId: row.meter_id, connectionId: row.connection_id ?? '', periodStart: monthStart(new Date(at)) }, BigInt(estimate.fee_units));
}

/** Pending records among these, with what their holds were estimated from (null when not kept). */
async function pendingWithEstimates(trx: Transaction<Database>, recordIds: string[]) {
  const pending = await trx.selectFrom('requests').selectAll().where('id', 'in', recordIds).where('status', '=', 'pending').orderBy('id').execute();
  return pending.map((row) => ({ row, estimate: row.hold_estimate ? (JSON.parse(row.hold_estimate) as KeptEstimate) : null }));
}

/**
 * Before the sweep locks the wallets of the requests it is about to expire: locks the tier
 * counters their recovery will advance, so the sweep takes its locks in the global order (tier
 * counters, then wallets) as settlements do, and cannot deadlock with one.
 */
export async function lockRecoveryCounters(trx: Transaction<Database>, dialect: Storage['dialect'], recordIds: string[], at: string): Promise<void> {
  if (recordIds.length === 0) return;
  const counters = (await pendingWithEstimates(trx, recordIds)).flatMap(({ row, estimate }) => recoveredCounter(row, estimate, at) ?? []);
  await lockUsageCounters(trx, dialect, counters);
}

/**
 * Inside the sweep's transaction, for the requests whose holds it just expired: each pending
 * record with an estimate is charged it and completed (`usage_estimated`), one without is failed.
 * Records no longer pending (settled meanwhile) are left alone. Returns how many were charged.
 */
export async function recoverPendingInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], recordIds: string[], at: string): Promise<number> {
  if (recordIds.length === 0) return 0;
  const kept = await pendingWithEstimates(trx, recordIds);
  const walletIds = kept.flatMap(({ estimate }) => (estimate ? [estimate.payer_wallet_id, estimate.merchant_wallet_id] : []));
  const wallets = walletIds.length > 0 ? await lockWallets(trx, dialect, walletIds) : new Map();
  let charged = 0;
  /** The wallets debited, each with its customer (null for a merchant's), written once at the end. */
  const debited = new Map<WalletRow, string | null>();
  /** Tier positions the charged requests advance, as their settlements would have. */
  const advances: (CounterKey & { units: bigint })[] = [];
  for (const { row, estimate } of kept) {
    if (!estimate) {
      await failPendingRecord(trx, dialect, row.id, at);
      await finishReservation(trx, dialect, row.id, 0n, new Date(at));
      continue;
    }
    const payer = wallets.get(estimate.payer_wallet_id);
    const merchantWallet = wallets.get(estimate.merchant_wallet_id);
    if (!payer || !merchantWallet) {
      await failPendingRecord(trx, dialect, row.id, at);
      continue;
    }
    const walletCost = BigInt(estimate.total_wallet_cost);
    const merchantCost = BigInt(estimate.total_merchant_cost);
    const debits = [...debitInMemory(payer, walletCost, estimate.draws_plan_credit === true), ...debitInMemory(merchantWallet, merchantCost, false)];
    const legs = chargeLegs(row.merchant_id, creditsOfEstimate(estimate), debits).filter((leg) => leg.amount !== 0n);
    if (legs.length > 0) {
      await appendTransaction(trx, { kind: 'request_charge', merchantId: row.merchant_id, reference: row.id, description: `Request ${row.id}`, legs, at });
    }
    await completePendingRecord(trx, dialect, completedFromEstimate(row, estimate, at));
    const counter = recoveredCounter(row, estimate, at);
    if (counter) advances.push(counter);
    await finishReservation(trx, dialect, row.id, walletCost + merchantCost, new Date(at));
    if (walletCost !== 0n) debited.set(payer, payer !== merchantWallet ? row.connection_id : null);
    if (merchantCost !== 0n && !debited.has(merchantWallet)) debited.set(merchantWallet, null);
    charged++;
  }
  await writeDebitedWallets(trx, debited, at);
  await advanceUsageCounters(trx, dialect, advances);
  return charged;
}

/** What a kept estimate credits besides the wallets, as its settlement would have (chargeCreditsOf). */
function creditsOfEstimate(estimate: KeptEstimate): ChargeCredits {
  return {
    providerCost: estimate.base_cost_charged ? BigInt(estimate.base_cost_total) : 0n,
    merchantRevenue: BigInt(estimate.fee_amount),
    serviceCharge: BigInt(estimate.service_charge_amount),
  };
}

/** Each wallet the recovered charges debited is written once, with one balance event (the one balance-event rule). */
async function writeDebitedWallets(trx: Transaction<Database>, debited: Map<WalletRow, string | null>, at: string): Promise<void> {
  const changes = new BalanceChanges();
  for (const [wallet, connectionId] of debited) {
    await saveBalance(trx, wallet);
    changes.note(wallet, connectionId);
  }
  for (const event of changes.events(at)) await enqueueEvent(trx, event);
}

/**
 * Adds each recovered request's units to its tier counter, in key order: one write for all of
 * them (the counters exist: lockRecoveryCounters created and locked them).
 */
async function advanceUsageCounters(trx: Transaction<Database>, dialect: Storage['dialect'], advances: (CounterKey & { units: bigint })[]): Promise<void> {
  const sums = new Map<string, CounterKey & { units: bigint }>();
  for (const advance of advances) {
    const id = counterId(advance);
    sums.set(id, counterAt(advance, (sums.get(id)?.units ?? 0n) + advance.units));
  }
  const rows = countersInKeyOrder([...sums.values()]).map((c) => counterRow(c, sums.get(counterId(c))!.units));
  await runWrites(trx, dialect, [{ addTo: 'meter_usage_counters', key: COUNTER_KEY, sums: ['units'], rows }]);
}

function completedFromEstimate(row: RequestRow, estimate: KeptEstimate, at: string): RequestRow {
  return {
    ...row,
    status: 'completed',
    input_tokens: BigInt(estimate.input_tokens),
    output_tokens: BigInt(estimate.output_tokens),
    input_characters: BigInt(estimate.input_characters),
    input_cost: BigInt(estimate.input_cost),
    output_cost: BigInt(estimate.output_cost),
    base_cost_charged: estimate.base_cost_charged ? 1 : 0,
    fee_amount: BigInt(estimate.fee_amount),
    breakdown: estimate.breakdown,
    service_charge_amount: BigInt(estimate.service_charge_amount),
    total_request_cost: BigInt(estimate.total_request_cost),
    total_wallet_cost: BigInt(estimate.total_wallet_cost),
    total_merchant_cost: BigInt(estimate.total_merchant_cost),
    usage_estimated: 1,
    provider_timestamp: at,
    completed_at: at,
  };
}

/**
 * A request its instance never sent (its admission's commit met a lost connection, so the instance
 * answered 503 without knowing whether it committed): its pending record, if it was written, is
 * failed and its holds released. Provably never reached: the instance saw it.
 */
export async function releaseUnsentAdmission(storage: Storage, recordId: string, now: Date): Promise<void> {
  await storage.db.transaction().execute(async (trx) => {
    const holds = await trx.selectFrom('holds').select(['id', 'wallet_id']).where('reference', '=', recordId).where('status', '=', 'active').execute();
    const wallets = holds.length > 0 ? await lockWallets(trx, storage.dialect, holds.map((hold) => hold.wallet_id)) : new Map();
    for (const hold of holds) await releaseHoldInTransaction(trx, hold.id, 'released', wallets);
    if (await failPendingRecord(trx, storage.dialect, recordId, now.toISOString())) await finishReservation(trx, storage.dialect, recordId, 0n, now);
  });
}

/**
 * Charges these pending records their estimates now, releasing their active holds first: their
 * calls' relays ended with their process, before any outcome was known (the call journal had none,
 * decision 0024), so the sweep's charge is made at once instead of after the holds' TTL. Locks in
 * the global order: tier counters, then every wallet the holds or the charges touch.
 */
export async function recoverUnsettled(storage: Storage, recordIds: string[], at: string): Promise<number> {
  if (recordIds.length === 0) return 0;
  return storage.db.transaction().execute(async (trx) => {
    await lockRecoveryCounters(trx, storage.dialect, recordIds, at);
    const holds = await trx.selectFrom('holds').select(['id', 'wallet_id']).where('reference', 'in', recordIds).where('status', '=', 'active').execute();
    const charged = (await pendingWithEstimates(trx, recordIds)).flatMap(({ estimate }) => (estimate ? [estimate.payer_wallet_id, estimate.merchant_wallet_id] : []));
    const walletIds = [...holds.map((hold) => hold.wallet_id), ...charged];
    const wallets = walletIds.length > 0 ? await lockWallets(trx, storage.dialect, walletIds) : new Map<string, WalletRow>();
    for (const hold of holds) await releaseHoldInTransaction(trx, hold.id, 'released', wallets);
    return recoverPendingInTransaction(trx, storage.dialect, recordIds, at);
  });
}
