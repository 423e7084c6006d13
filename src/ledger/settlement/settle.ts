/**
 * Settlement of forwarded requests: charge the actual cost against the admission's holds and
 * complete the pending record, or fail it (release the holds, record `error`, charge nothing).
 */
import type { Transaction } from 'kysely';
import { newId } from '../../domain/ids.ts';
import { MAX_AMOUNT_UNITS } from '../../domain/money.ts';
import { baseCost, priceRequest, type BasePrices, type PricedRequest, type Usage } from '../../domain/pricing.ts';
import { RunAlone, type BatchJob } from '../group-commit.ts';
import { finishReservation } from '../spend-key-limits.ts';
import { insertRows, runWrites, type BatchWrite } from '../../storage/batch-write.ts';
import type { Storage } from '../../storage/db.ts';
import type { Database } from '../../storage/schema.ts';
import { failPendingRecord, metadataRollupAdditions, metadataRollupUpsert, metadataRows, rollupAdditions, rollupUpsert, type RequestRow } from '../../storage/requests.ts';
import { merchantRevenueAccount, providerCostsAccount, serviceChargesAccount } from '../accounts.ts';
import { batchTime, chargeRequest, completedRequestRow, counterId, lockUsageCounters, monthStart, type ChargeInput, type ChargeOutcome, type CounterKey, type RecordIdentity } from '../charge.ts';
import { UnbalancedTransactionError, type Leg } from '../postings.ts';
import { releaseHoldInTransaction } from '../holds.ts';
import { debitInMemory, lockWallets, type WalletRow } from '../wallets.ts';
import { markLeaseLost, type Lease } from '../leases.ts';
import { overrunWallets } from '../admission/decision.ts';
import { walletBalanceEvent } from '../events.ts';
import { eventRows, type NewEvent } from '../../webhooks/outbox.ts';
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
  /** When the request is settled, by the app's clock (default: the system clock). */
  now?: Date;
};

export type PendingFacts = Pick<RequestRow, 'provider' | 'endpoint' | 'provider_key_type' | 'created_at'> & { metadata: Record<string, string> };

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
    requestedModel: input.requestedModel ?? null,
    endpoint: pending.endpoint,
    providerKeyType: pending.provider_key_type,
    basePrices: input.prices,
    baseCostCharged: input.baseCostCharged,
    serviceChargeRate: input.serviceChargeRate,
    metadata: pending.metadata,
    responseId: input.responseId,
    providerTimestamp: input.providerTimestamp ?? batchTime([input]).toISOString(),
    usageEstimated: input.usageEstimated,
    holdIds: input.holdIds,
    drawsPlanCredit: input.billing.drawsPlanCredit ?? false,
    pendingRecordId: input.recordId,
    now: batchTime([input]),
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
 * charge settleRequest makes for each (chargeRequest's pricing, tier positions, bucket order,
 * ledger legs, record and rollup), taken in the order given, with each table written in a fixed
 * number of statements for the whole batch, and one balance event per wallet the batch changed.
 * Locks are taken in the global order every writer uses: tier counters, then wallets, then spend
 * keys.
 *
 * Anything but a plain settlement (a hold no longer active, a record no longer pending, a price
 * past the limit) rolls the whole batch back (RunAlone), and every member is then settled alone by
 * settleRequest, which knows how to answer it.
 */
async function settleInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: SettleInput[]): Promise<ChargeOutcome[]> {
  const now = batchTime(inputs);
  const at = now.toISOString();
  const periodStart = monthStart(now);
  if (inputs.some((input) => !input.record)) throw new RunAlone();

  // Tier positions, locked.
  const counterOf = (input: SettleInput) => settlementCounter(input, periodStart);
  const counterKeys = new Map<string, CounterKey>();
  for (const input of inputs) {
    const key = counterOf(input);
    if (key) counterKeys.set(counterId(key), key);
  }
  const positions = await lockUsageCounters(trx, dialect, [...counterKeys.values()]);
  // Then the wallets, before anything else is written: a POST /requests charge locks its wallets
  // before its rollups, and rollups written first here could deadlock with it.
  const wallets = await lockWallets(trx, dialect, settlementWalletIds(inputs));
  const lockedState = new Map([...wallets.values()].map((w) => [w.id, walletState(w)]));

  // Price each request at its tier position, complete its record (a record no longer pending
  // makes the batch run alone), roll it up.
  const priced: PricedRequest[] = [];
  const changedCounters = new Set<string>();
  for (const input of inputs) {
    const key = counterOf(input);
    const base = input.prices
      ? baseCost(input.prices, input.usage)
      : { input: 0n, output: 0n, total: 0n };
    const price = priceRequest({
      meter: pricingFor(input.billing).pricing,
      usage: input.usage,
      baseCost: base,
      accumulatedUnits: key ? (positions.get(counterId(key)) ?? 0n) : 0n,
      serviceChargeRate: input.serviceChargeRate,
      baseCostCharged: input.baseCostCharged,
    });
    if (price.totals.request > MAX_AMOUNT_UNITS || price.baseCost.total > MAX_AMOUNT_UNITS) throw new RunAlone();
    if (key) {
      positions.set(counterId(key), price.accumulatedUnits);
      changedCounters.add(counterId(key));
    }
    priced.push(price);
  }
  const records = inputs.map((input, i) => completedRecord(input, input.record!, priced[i]!, at));
  const recordWrites = records.flatMap((record, i) => {
    if (inputs[i]!.merged) return [];
    const { id, merchant_id: _m, request_id: _r, created_at: _c, metadata: _md, ...settled } = record;
    return [{ query: trx.updateTable('requests').set(settled).where('id', '=', id).where('status', '=', 'pending').returning('id'), counted: true }];
  });
  const mergedRecords = records.filter((_record, i) => inputs[i]!.merged);
  const counterWrites = [...changedCounters].map((id) => {
    const key = counterKeys.get(id)!;
    return {
      query: trx
        .updateTable('meter_usage_counters')
        .set({ units: positions.get(id)! })
        .where('meter_id', '=', key.meterId)
        .where('connection_id', '=', key.connectionId)
        .where('period_start', '=', key.periodStart),
    };
  });
  const counts = await runWrites(trx, dialect, [...recordWrites, ...counterWrites, ...rollupWrites(trx, records), ...insertWrites(dialect, mergedRecords)]);
  if (counts.slice(0, recordWrites.length).some((n) => n !== 1)) throw new RunAlone();

  // Release the holds, debit, and write the ledger and the balance events.
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

  const outcomes: ChargeOutcome[] = [];
  const leaseShrinks = new Map<Lease, bigint>();
  /** Wallets a member cost more than it held on them (decision 0019). */
  const overrun = new Set<WalletRow>();
  const transactions: { id: string; reference: string; description: string; merchantId: string; legs: Leg[] }[] = [];
  /** Each wallet the batch changed, with its customer (null for a merchant's wallet). */
  const changedWallets = new Map<WalletRow, string | null>();
  for (const [i, input] of inputs.entries()) {
    const price = priced[i]!;
    const customerWallet = wallets.get(input.billing.connection?.wallet_id ?? input.billing.merchantWalletId)!;
    const merchantWallet = wallets.get(input.billing.merchantWalletId)!;
    // This request's holds end as it is charged, so its balance events show what it left held.
    for (const holdId of input.merged ? [] : input.holdIds) {
      const hold = releasedById.get(holdId)!;
      wallets.get(hold.wallet_id)!.held -= BigInt(hold.amount);
    }
    if (input.merged?.leased) settleLeasedShares(input.merged, price, customerWallet, merchantWallet, leaseShrinks);
    const heldOn = (wallet: WalletRow) =>
      input.merged
        ? input.merged.holds.filter((hold) => hold.wallet_id === wallet.id).reduce((sum, hold) => sum + hold.amount, 0n)
        : input.holdIds.reduce((sum, holdId) => (releasedById.get(holdId)!.wallet_id === wallet.id ? sum + BigInt(releasedById.get(holdId)!.amount) : sum), 0n);
    for (const wallet of overrunWallets(price, customerWallet, merchantWallet, heldOn)) overrun.add(wallet);
    const merchantId = input.billing.merchantId;
    const legs: Leg[] = [
      ...debitInMemory(customerWallet, price.totals.wallet, input.billing.drawsPlanCredit ?? false),
      // A merchant's wallet has no plan credit.
      ...debitInMemory(merchantWallet, price.totals.merchant, false),
      { account: providerCostsAccount(merchantId), amount: price.baseCost.charged ? price.baseCost.total : 0n },
      { account: merchantRevenueAccount(merchantId), amount: price.fee.amount },
      { account: serviceChargesAccount(), amount: price.serviceCharge.amount },
    ];
    transactions.push({ id: newId('transaction'), reference: input.recordId, description: `Request ${input.recordId}`, merchantId, legs });
    outcomes.push({ outcome: 'recorded', row: records[i]!, priced: price });

    for (const wallet of new Set<WalletRow>([customerWallet, merchantWallet])) {
      const pays = (wallet === customerWallet ? price.totals.wallet : 0n) + (wallet === merchantWallet ? price.totals.merchant : 0n);
      if (pays === 0n && input.holdIds.length === 0) continue;
      changedWallets.set(wallet, wallet === customerWallet ? (input.billing.connection?.id ?? null) : null);
    }
  }
  // One balance event per wallet the batch changed, with the balance the batch left: what a
  // webhook receiver acts on is the latest balance, and a busy wallet's batch holds hundreds of
  // requests (decision 0008).
  const events: NewEvent[] = [];
  for (const [wallet, connectionId] of changedWallets) events.push(walletBalanceEvent(wallet, connectionId, at));

  const walletWrites = [...changedWallets.keys()]
    .filter((wallet) => lockedState.get(wallet.id) !== walletState(wallet))
    .map((wallet) => ({
      query: trx
        .updateTable('wallets')
        .set({ balance: wallet.balance, cycle_credit: wallet.cycle_credit, bundle_credit: wallet.bundle_credit, held: wallet.held, overrun: overrun.has(wallet) ? 1 : Number(wallet.overrun ?? 0) })
        .where('id', '=', wallet.id),
    }));
  const leaseWrites: BatchWrite[] = [...leaseShrinks].map(([lease, amount]) => ({
    query: trx
      .updateTable('holds')
      .set((eb) => ({ amount: eb('amount', '-', amount) }))
      .where('id', '=', lease.holdId)
      .where('status', '=', 'active')
      .returning('id'),
    counted: true,
  }));
  const written = await runWrites(trx, dialect, [
    ...leaseWrites,
    ...walletWrites,
    ...ledgerWrites(dialect, transactions, at),
    ...(events.length > 0 ? [insertRows(dialect, 'events', eventRows(events))] : []),
  ]);
  // A lease that expired meanwhile: each member alone writes its admission as its own hold first.
  if (written.slice(0, leaseWrites.length).some((n) => n !== 1)) throw new RunAlone();
  // Spend keys last, in id order.
  const withKeys = inputs
    .map((input, i) => ({ input, outcome: outcomes[i]! }))
    .filter(({ input }) => input.billing.spendKey)
    .sort((a, b) => (a.input.billing.spendKey!.id < b.input.billing.spendKey!.id ? -1 : 1));
  for (const { input, outcome } of withKeys) await finishReservation(trx, dialect, input.recordId, spendOf(outcome), now);
  return outcomes;
}

/** The tier counter a settlement prices at, for the month it settles in; null when its meter has none. */
function settlementCounter(input: SettleInput, periodStart: string): CounterKey | null {
  return pricingFor(input.billing).meterPriced
    ? { meterId: input.billing.meter!.id, connectionId: input.billing.connection?.id ?? '', periodStart }
    : null;
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
    // An overrun wallet admits nothing more until what is in flight has settled (decision 0019):
    // nothing more is taken from this lease, and the next admission is decided in the database.
    if (beyond > 0n) markLeaseLost(lease);
    lease.free -= extra;
    wallet.held -= hold.amount + extra;
    shrinks.set(lease, (shrinks.get(lease) ?? 0n) + hold.amount + extra);
  }
}

const walletState = (w: WalletRow) => `${w.balance} ${w.cycle_credit} ${w.bundle_credit} ${w.held}`;

/** Settled records whose admissions were never written (merged): the records and their metadata. */
function insertWrites(dialect: Storage['dialect'], records: RequestRow[]): BatchWrite[] {
  if (records.length === 0) return [];
  const metadata = metadataRows(records);
  return [insertRows(dialect, 'requests', records), ...(metadata.length > 0 ? [insertRows(dialect, 'request_metadata', metadata)] : [])];
}

/** Balanced ledger transactions (legs summing to zero, zero legs left out): their two inserts. */
function ledgerWrites(
  dialect: Storage['dialect'],
  transactions: { id: string; reference: string; description: string; merchantId: string; legs: Leg[] }[],
  at: string,
): BatchWrite[] {
  if (transactions.length === 0) return [];
  const postings: { id: string; transaction_id: string; account: string; amount: bigint; created_at: string }[] = [];
  for (const t of transactions) {
    const legs = t.legs.filter((l) => l.amount !== 0n);
    const sum = legs.reduce((acc, l) => acc + l.amount, 0n);
    if (sum !== 0n) throw new UnbalancedTransactionError(`ledger transaction request_charge is off by ${sum}`);
    for (const leg of legs) postings.push({ id: newId('posting'), transaction_id: t.id, account: leg.account, amount: leg.amount, created_at: at });
  }
  const rows = transactions.map((t) => ({ id: t.id, kind: 'request_charge', merchant_id: t.merchantId, reference: t.reference, description: t.description, created_at: at }));
  return [insertRows(dialect, 'ledger_transactions', rows), ...(postings.length > 0 ? [insertRows(dialect, 'ledger_postings', postings)] : [])];
}

/** The completed record a settlement writes over the pending one. */
function completedRecord(input: SettleInput, pending: PendingFacts, priced: PricedRequest, at: string): RequestRow {
  const identity: RecordIdentity = {
    id: input.recordId,
    merchant_id: input.billing.merchantId,
    request_id: input.recordId,
    body_hash: null,
    connection_id: input.billing.connection?.id ?? null,
    meter_id: input.billing.meter?.id ?? null,
    provider: pending.provider,
    model: input.model,
    requested_model: input.requestedModel ?? null,
    endpoint: pending.endpoint,
    provider_key_type: pending.provider_key_type,
    response_id: input.responseId,
    provider_timestamp: input.providerTimestamp ?? at,
    metadata: JSON.stringify(pending.metadata),
    created_at: pending.created_at,
  };
  return completedRequestRow(identity, input.usage, priced, input.usageEstimated, at);
}

/**
 * A PostgreSQL statement takes at most 65,535 parameters and the batch's writes go as one; a
 * metadata rollup row takes 14. Records carrying so many pairs that their rollup rows would pass
 * this budget (64 settlements of ~45 pairs each) are settled alone instead, where they fit.
 */
const METADATA_ROLLUP_PARAMETER_BUDGET = 40_000;

/** Adds completed records to both usage rollups, summed per rollup row first, in key order. */
function rollupWrites(trx: Transaction<Database>, records: RequestRow[]): BatchWrite[] {
  const rollups = rollupAdditions(records);
  const metadataRollups = metadataRollupAdditions(records);
  if (metadataRollups.length * 14 > METADATA_ROLLUP_PARAMETER_BUDGET) throw new RunAlone();
  const writes: BatchWrite[] = [];
  if (rollups.length > 0) writes.push({ query: rollupUpsert(trx, rollups) });
  if (metadataRollups.length > 0) writes.push({ query: metadataRollupUpsert(trx, metadataRollups) });
  return writes;
}

/** The upstream failed (or the hold expired): release the holds, record `error`, charge nothing. */
export async function failRequest(storage: Storage, input: FailInput): Promise<void> {
  await storage.db.transaction().execute((trx) => failInTransaction(trx, storage.dialect, [input]));
}

export type FailInput = { recordId: string; holdIds: string[]; /** By the app's clock (default: the system clock). */ now?: Date };

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
    await failPendingRecord(trx, input.recordId, at);
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

/** Settlement and failure as group-commit jobs (gateway/writer.ts); they run before admissions. */
export const SETTLE_JOB: BatchJob<SettleInput, ChargeOutcome> = {
  order: 0,
  locks: (_trx, inputs) => {
    const periodStart = monthStart(batchTime(inputs));
    return {
      counters: inputs.flatMap((input) => settlementCounter(input, periodStart) ?? []),
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

/** The spend keys requests name (admissions and settlements know theirs). */



/** The spend keys that hold a reservation for these records (a failure knows only its record). */
async function reservedSpendKeyIds(trx: Transaction<Database>, recordIds: string[]): Promise<string[]> {
  if (recordIds.length === 0) return [];
  const rows = await trx.selectFrom('spend_key_reservations').select('spend_key_id').where('request_pk', 'in', recordIds).execute();
  return rows.map((row) => row.spend_key_id);
}
