/**
 * Settlement of forwarded requests: charge the actual cost against the admission's holds and
 * complete the pending record, or fail it (release the holds, record `error`, charge nothing).
 */
import type { Transaction } from 'kysely';
import type { BasePrices, PricedRequest, Usage } from '../../domain/pricing.ts';
import { RunAlone, type BatchJob } from '../group-commit.ts';
import { finishReservation } from '../spend-key-limits.ts';
import { runWrites, type BatchWrite } from '../../storage/batch-write.ts';
import type { Storage } from '../../storage/db.ts';
import { COUNTER_KEY, type Database } from '../../storage/schema.ts';
import { failPendingRecord, metadataRows, type RequestRow } from '../../storage/requests.ts';
import { rollupWrites } from '../../storage/rollups.ts';
import { batchTime, chargeRequest, postCharge, type ChargeInput, type ChargeOutcome, type PostedCharge } from '../charge.ts';
import { counterId, counterKeyOf, counterRow, lockUsageCounters, type CounterKey } from '../tier-counters.ts';
import { ledgerRows } from '../postings.ts';
import { releaseHoldInTransaction } from '../holds.ts';
import { lockWallets, type WalletRow } from '../wallets.ts';
import { markLeaseLost, type Lease } from '../leases.ts';
import { overrunWallets, payerWalletOf, priceCharge } from '../decide/charge.ts';
import { drawsPlanCredit } from '../decide/balance.ts';
import { BalanceChanges } from '../events.ts';
import { eventRows } from '../../webhooks/outbox.ts';
import { pricingFor, type BillingContext } from '../billing.ts';
import { writeAdmissionAlone, type AdmissionWrite } from '../admission/deferred.ts';
import { spendKeyIdsOf } from '../admission/admit.ts';

/**
 * How long settlements and failures (off the response path) may wait for other work to share
 * their transaction: long enough that an idle instance writes a few requests per commit, instead
 * of making the next request's admission wait behind one.
 */
const SETTLEMENT_WAIT_MS = 25;

export type SettleInput = {
  recordId: string;
  holdIds: string[];
  billing: BillingContext;
  usage: Usage;
  /** The model the provider served. */
  model: string | null;
  /** The model the request named, when it differs from `model`. */
  requestedModel?: string | null;
  prices: BasePrices | null;
  baseCostCharged: boolean;
  serviceChargeRate: bigint;
  responseId: string | null;
  usageEstimated: boolean;
  /** When the provider says it answered (ISO 8601); absent = the settlement's own time. */
  providerTimestamp?: string | null;
  /**
   * What the pending record already says (known to the caller that admitted it). Without it the
   * pending record is read first.
   */
  record?: PendingFacts;
  /**
   * A deferred admission this settlement took over before it was written (decision 0011): the
   * settled record is inserted directly, and its holds were never rows.
   */
  merged?: AdmissionWrite;
  /** When the request is settled, by the app's clock. */
  now: Date;
};

export type PendingFacts = Pick<RequestRow, 'provider' | 'endpoint' | 'provider_key_type' | 'created_at'> & { metadata: Record<string, string> };

/**
 * A settlement as the charge it is (ledger/charge.ts): priced, split into legs, posted and recorded
 * as every charge is, against the admission's holds, completing its pending record. `now` is the
 * time it is written at (a batch's is its newest member's).
 */
function chargeInputOf(input: SettleInput, pending: PendingFacts, now = batchTime([input])): ChargeInput {
  const { pricing, meterPriced } = pricingFor(input.billing);
  return {
    merchant: { id: input.billing.merchantId, wallet_id: input.billing.merchantWalletId },
    connection: input.billing.connection,
    meter: input.billing.meter,
    pricing: meterPriced ? undefined : pricing,
    // Forwarded records use their id as request_id.
    requestId: input.recordId,
    bodyHash: null,
    usage: input.usage,
    provider: pending.provider,
    model: input.model,
    requestedModel: input.requestedModel ?? null,
    endpoint: pending.endpoint,
    providerKeyType: pending.provider_key_type,
    basePrices: input.prices,
    baseCostCharged: input.baseCostCharged,
    serviceChargeRate: input.serviceChargeRate,
    metadata: pending.metadata,
    responseId: input.responseId,
    providerTimestamp: input.providerTimestamp ?? now.toISOString(),
    usageEstimated: input.usageEstimated,
    holdIds: input.holdIds,
    drawsPlanCredit: drawsPlanCredit(input.billing),
    pendingRecordId: input.recordId,
    createdAt: pending.created_at,
    now,
  };
}

const spendOf = (outcome: ChargeOutcome): bigint =>
  outcome.outcome === 'recorded' ? outcome.priced.totals.wallet + outcome.priced.totals.merchant : 0n;

/** Charges the actual cost of a completed forwarded request and completes its pending record. */
export async function settleRequest(storage: Storage, input: SettleInput): Promise<ChargeOutcome> {
  const readPending = () => storage.db.selectFrom('requests').selectAll().where('id', '=', input.recordId).executeTakeFirst();
  let pending = await readPending();
  if (!pending && input.merged) {
    // Alone, a merged admission is written first (once), then settled as any other.
    await writeAdmissionAlone(storage, input.merged);
    pending = await readPending();
  }
  if (!pending || pending.status !== 'pending') return { outcome: 'duplicate' };
  // The reservation ends in the charge's transaction: a crash cannot leave one without the other.
  return chargeRequest(
    storage,
    chargeInputOf(input, { ...pending, metadata: JSON.parse(pending.metadata) as Record<string, string> }),
    input.billing.spendKey ? (trx, charged) => finishReservation(trx, storage.dialect, input.recordId, spendOf(charged), batchTime([input])) : undefined,
  );
}


/**
 * Settlements of several requests inside one (group-commit) transaction, set-based: the same
 * charge settleRequest makes for each (chargeRequest's priceCharge at the locked tier position,
 * postCharge's debits, legs, ledger transaction and record), taken in the order given, with each
 * table written in a fixed number of statements for the whole batch, and one balance event per
 * wallet the batch changed (BalanceChanges). Locks are taken in the global order every writer
 * uses: tier counters, then wallets, then spend keys.
 *
 * Anything but a plain settlement (a hold no longer active, a record no longer pending, a price
 * past the limit) rolls the whole batch back (RunAlone), and every member is then settled alone by
 * settleRequest, which knows how to answer it.
 */
async function settleInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: SettleInput[]): Promise<ChargeOutcome[]> {
  const now = batchTime(inputs);
  const at = now.toISOString();
  if (inputs.some((input) => !input.record)) throw new RunAlone();
  const charges = inputs.map((input) => chargeInputOf(input, input.record!, now));

  // Tier positions, locked. Then the wallets, before anything else is written: a POST /requests
  // charge locks its wallets before its rollups, and rollups written first here could deadlock with it.
  const counterKeys = charges.map((charge) => counterKeyOf(charge, now));
  const positions = await lockUsageCounters(trx, dialect, counterKeys.filter((key) => key !== null));
  const wallets = await lockWallets(trx, dialect, settlementWalletIds(inputs));
  const lockedState = new Map([...wallets.values()].map((w) => [w.id, walletState(w)]));

  // Price each request at its tier position and post it on its wallets, as every charge is.
  const posted: Posted[] = [];
  const changedCounters = new Map<string, CounterKey>();
  let sliceStart = performance.now();
  for (const [i, charge] of charges.entries()) {
    if (sliceIsOver(sliceStart)) sliceStart = await nextTurn();
    const key = counterKeys[i];
    const priced = priceCharge(charge, key ? (positions.get(counterId(key)) ?? 0n) : 0n);
    if (priced === 'amount_too_large') throw new RunAlone();
    if (key) {
      positions.set(counterId(key), priced.accumulatedUnits);
      changedCounters.set(counterId(key), key);
    }
    const customerWallet = wallets.get(payerWalletOf(charge))!;
    const merchantWallet = wallets.get(charge.merchant.wallet_id)!;
    const { record, transaction } = postCharge(charge, priced, inputs[i]!.recordId, customerWallet, merchantWallet, at);
    posted.push({ priced, record, transaction, customerWallet, merchantWallet });
  }

  // Complete each record (a record no longer pending makes the batch run alone), roll it up.
  const records = posted.map((p) => p.record);
  const pendingRecords = records.filter((_record, i) => !inputs[i]!.merged);
  const completed: BatchWrite = {
    update: 'requests',
    // The merchant leads every statement on a per-request table (decision 0041).
    key: ['merchant_id', 'id'],
    rows: pendingRecords.map(({ request_id: _r, created_at: _c, metadata: _md, ...settled }) => settled),
    onlyIf: { column: 'status', is: 'pending' },
    counted: true,
  };
  const counters: BatchWrite = {
    update: 'meter_usage_counters',
    key: COUNTER_KEY,
    rows: [...changedCounters].map(([id, key]) => counterRow(key, positions.get(id)!)),
  };
  const [completedCount] = await runWrites(trx, dialect, [completed, counters, ...rollupWrites(records), ...insertWrites(records.filter((_record, i) => inputs[i]!.merged))]);
  if (completedCount !== pendingRecords.length) throw new RunAlone();

  // Release the holds; then write the balances, the ledger and the balance events.
  const holdIds = inputs.flatMap((input) => (input.merged ? [] : input.holdIds));
  const released = holdIds.length
    ? await trx
        .updateTable('holds')
        .set({ status: 'settled' })
        .where('id', 'in', holdIds)
        .where('status', '=', 'active')
        .returning(['id', 'wallet_id', 'amount'])
        .execute()
    : [];
  if (released.length !== holdIds.length) throw new RunAlone();
  const releasedById = new Map(released.map((hold) => [hold.id, hold]));
  sliceStart = performance.now();

  const leaseShrinks = new Map<Lease, bigint>();
  /** Wallets a member cost more than it held on them (decision 0019). */
  const overrun = new Map<WalletRow, number>();
  const changes = new BalanceChanges();
  for (const [i, input] of inputs.entries()) {
    const { priced, customerWallet, merchantWallet } = posted[i]!;
    // This request's holds end as it is charged, so the balance events show what is left held.
    for (const holdId of input.merged ? [] : input.holdIds) {
      const hold = releasedById.get(holdId)!;
      wallets.get(hold.wallet_id)!.held -= BigInt(hold.amount);
    }
    if (input.merged?.leased) settleLeasedShares(input.merged, priced, customerWallet, merchantWallet, leaseShrinks);
    const heldOn = (wallet: WalletRow) =>
      input.merged
        ? input.merged.holds.filter((hold) => hold.wallet_id === wallet.id).reduce((sum, hold) => sum + hold.amount, 0n)
        : input.holdIds.reduce((sum, holdId) => (releasedById.get(holdId)!.wallet_id === wallet.id ? sum + BigInt(releasedById.get(holdId)!.amount) : sum), 0n);
    for (const [wallet, excess] of overrunWallets(priced, customerWallet, merchantWallet, heldOn)) overrun.set(wallet, Math.max(excess, overrun.get(wallet) ?? 0));
    changes.noteCharge(charges[i]!, priced, customerWallet, merchantWallet, input.holdIds.length > 0);
  }

  const balances = [...wallets.values()]
    .filter((wallet) => lockedState.get(wallet.id) !== walletState(wallet))
    .map((wallet) => ({
      id: wallet.id,
      balance: wallet.balance,
      cycle_credit: wallet.cycle_credit,
      bundle_credit: wallet.bundle_credit,
      held: wallet.held,
      overrun: overrun.get(wallet) ?? Number(wallet.overrun ?? 0),
    }));
  const leases: BatchWrite = {
    update: 'holds',
    key: ['id'],
    rows: [...leaseShrinks].map(([lease, amount]) => ({ id: lease.holdId, amount })),
    subtract: ['amount'],
    onlyIf: { column: 'status', is: 'active' },
    counted: true,
  };
  if (sliceIsOver(sliceStart)) await nextTurn();
  const ledger = ledgerRows(posted.map((p) => p.transaction));
  const [shrunk] = await runWrites(trx, dialect, [
    leases,
    { update: 'wallets', key: ['id'], rows: balances },
    { insert: 'ledger_transactions', rows: ledger.transactions },
    { insert: 'ledger_postings', rows: ledger.postings },
    { insert: 'events', rows: eventRows(changes.events(at)) },
  ]);
  // A lease that expired meanwhile: each member alone writes its admission as its own hold first.
  if (shrunk !== leases.rows.length) throw new RunAlone();
  // Spend keys last, in id order.
  const outcomes: ChargeOutcome[] = posted.map(({ record, priced }) => ({ outcome: 'recorded', row: record, priced }));
  const withKeys = inputs
    .map((input, i) => ({ input, outcome: outcomes[i]! }))
    .filter(({ input }) => input.billing.spendKey)
    .sort((a, b) => (a.input.billing.spendKey!.id < b.input.billing.spendKey!.id ? -1 : 1));
  for (const { input, outcome } of withKeys) await finishReservation(trx, dialect, input.recordId, spendOf(outcome), now);
  return outcomes;
}

/**
 * A settlement batch's work between two statements is synchronous: pricing and posting each member,
 * then building the rows of every table. Once a stretch of it has run SLICE_MS, it gives the event
 * loop a turn, so a request in flight waits behind a slice of a batch rather than all of it. Turns
 * by elapsed time, not by member count: each turn keeps the batch's transaction (and its row locks)
 * open and its members alive while the loop runs, which under saturation is several milliseconds,
 * so a batch takes only as many as its length needs (decision 0008). The time is the process's
 * monotonic clock, not the app's injected one: it measures work, not business time.
 */
const SLICE_MS = 1;

/** Whether the slice of synchronous work that began at `start` has run SLICE_MS. */
const sliceIsOver = (start: number) => performance.now() - start >= SLICE_MS;

/** Yields to the event loop for one turn; resolves with the time the next slice starts. */
const nextTurn = () => new Promise<number>((resolve) => setImmediate(() => resolve(performance.now())));

/** A member of a settlement batch, priced and posted on its locked wallets. */
type Posted = PostedCharge & { priced: PricedRequest; customerWallet: WalletRow; merchantWallet: WalletRow };

/** The tier counter a settlement prices at, for the month it settles in; null when its meter has none. */
function settlementCounter(input: SettleInput, now: Date): CounterKey | null {
  const { pricing, meterPriced } = pricingFor(input.billing);
  return counterKeyOf({ meter: input.billing.meter, connection: input.billing.connection, pricing: meterPriced ? undefined : pricing }, now);
}

/** Every wallet a settlement may change: its payer's and its merchant's. */
function settlementWalletIds(inputs: SettleInput[]): string[] {
  return inputs.flatMap((input) => [input.billing.connection?.wallet_id ?? input.billing.merchantWalletId, input.billing.merchantWalletId]);
}

/**
 * A settlement that took over an admission taken from leases: each hold's share leaves its lease
 * row (and `held`) now, and so does what the request costs that wallet beyond its share while the
 * lease still has it free, so a lease never promises what its wallet has already paid.
 */
function settleLeasedShares(write: AdmissionWrite, price: PricedRequest, customerWallet: WalletRow, merchantWallet: WalletRow, shrinks: Map<Lease, bigint>): void {
  for (const hold of write.holds) {
    const lease = write.leased!.byWallet.get(hold.wallet_id)!;
    const wallet = hold.wallet_id === customerWallet.id ? customerWallet : merchantWallet;
    const cost = (wallet === customerWallet ? price.totals.wallet : 0n) + (wallet === merchantWallet ? price.totals.merchant : 0n);
    const beyond = cost - hold.amount;
    const extra = beyond <= 0n ? 0n : beyond < lease.free ? beyond : lease.free;
    // An overrun wallet's admissions count what its requests in flight may overrun (decision 0025),
    // which a lease's slice cannot: nothing more is taken from this lease, and the next admission
    // is decided in the database.
    if (beyond > 0n) markLeaseLost(lease);
    lease.free -= extra;
    wallet.held -= hold.amount + extra;
    shrinks.set(lease, (shrinks.get(lease) ?? 0n) + hold.amount + extra);
  }
}

const walletState = (w: WalletRow) => `${w.balance} ${w.cycle_credit} ${w.bundle_credit} ${w.held}`;

/** Settled records whose admissions were never written (merged): the records and their metadata. */
function insertWrites(records: RequestRow[]): BatchWrite[] {
  return [
    { insert: 'requests', rows: records },
    { insert: 'request_metadata', rows: metadataRows(records) },
  ];
}

/** The upstream failed (or the hold expired): release the holds, record `error`, charge nothing. */
export async function failRequest(storage: Storage, input: FailInput): Promise<void> {
  await storage.db.transaction().execute((trx) => failInTransaction(trx, storage.dialect, [input]));
}

export type FailInput = { recordId: string; holdIds: string[]; /** By the app's clock. */ now: Date };

async function failInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: FailInput[]): Promise<void[]> {
  const now = batchTime(inputs);
  const at = now.toISOString();
  const holds = await holdsOf(trx, inputs.flatMap((input) => input.holdIds));
  // Every member's wallets at once, in the global order, before any record or rollup is written.
  const wallets = holds.length ? await lockWallets(trx, dialect, holds.map((h) => h.wallet_id)) : new Map<string, WalletRow>();
  const found = new Set(holds.map((hold) => hold.id));
  for (const input of inputs) {
    for (const holdId of input.holdIds) {
      if (found.has(holdId)) await releaseHoldInTransaction(trx, holdId, 'released', wallets);
    }
    await failPendingRecord(trx, dialect, input.recordId, at);
    await finishReservation(trx, dialect, input.recordId, 0n, now);
  }
  return inputs.map(() => undefined);
}


/**
 * The hold rows by id (unlocked; their wallets are locked next). None for no ids: a zero estimate,
 * or an expired hold's sweep, holds nothing, and PostgreSQL rejects an empty `in ()`.
 */
async function holdsOf(trx: Transaction<Database>, holdIds: string[]): Promise<{ id: string; wallet_id: string }[]> {
  return holdIds.length ? trx.selectFrom('holds').select(['id', 'wallet_id']).where('id', 'in', holdIds).execute() : [];
}

/** Settlement and failure as group-commit jobs (ledger/group-commit.ts); they run before admissions. */
export const SETTLE_JOB: BatchJob<SettleInput, ChargeOutcome> = {
  order: 0,
  locks: (_trx, inputs) => {
    const now = batchTime(inputs);
    return {
      counters: inputs.flatMap((input) => settlementCounter(input, now) ?? []),
      walletIds: settlementWalletIds(inputs),
      spendKeyIds: spendKeyIdsOf(inputs),
    };
  },
  waitMs: SETTLEMENT_WAIT_MS,
  inTransaction: settleInTransaction,
  alone: settleRequest,
};
export const FAIL_JOB: BatchJob<FailInput, void> = {
  order: 0,
  waitMs: SETTLEMENT_WAIT_MS,
  locks: async (trx, inputs) => ({
    walletIds: (await holdsOf(trx, inputs.flatMap((input) => input.holdIds))).map((hold) => hold.wallet_id),
    spendKeyIds: await reservedSpendKeyIds(trx, inputs.map((input) => input.recordId)),
  }),
  inTransaction: failInTransaction,
  alone: failRequest,
};

/** The spend keys that hold a reservation for these records (a failure knows only its record). */
async function reservedSpendKeyIds(trx: Transaction<Database>, recordIds: string[]): Promise<string[]> {
  if (recordIds.length === 0) return [];
  const rows = await trx.selectFrom('spend_key_reservations').select('spend_key_id').where('request_pk', 'in', recordIds).execute();
  return rows.map((row) => row.spend_key_id);
}
