/**
 * The money side of a forwarded request: admit (hold + pending record), then settle (charge the
 * actual cost against the holds) or fail (release the holds, record `error`, charge nothing).
 */
import { CompiledQuery, sql, type Compilable, type Insertable, type RawBuilder, type Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import { MAX_AMOUNT_UNITS } from '../domain/money.ts';
import { baseCost, priceRequest, type BasePrices, type MeterPricing, type PricedRequest, type Usage } from '../domain/pricing.ts';
import type { BillingContext } from '../gateway/credentials.ts';
import { RunAlone, type BatchJob, type GroupCommitWriter } from './group-commit.ts';
import { finishReservation, lockSpendKeyForAdmission, lockSpendKeys, reserveForRequest, type SpendKeyRequest } from '../gateway/spend-key-guard.ts';
import { ApiError } from '../http/errors.ts';
import { jsonInsert, JsonRows, valuesInserts } from '../storage/batch-write.ts';
import { prepared, type Storage } from '../storage/db.ts';
import type { MeterRow } from '../storage/meters.ts';
import type { Database } from '../storage/schema.ts';
import {
  failPendingRecord,
  insertMetadataRows,
  insertRequestRecord,
  metadataRollupAdditions,
  metadataRollupUpsert,
  metadataRows,
  rollupAdditions,
  rollupUpsert,
  type RequestRow,
} from '../storage/requests.ts';
import { merchantRevenueAccount, providerCostsAccount, serviceChargesAccount } from './accounts.ts';
import {
  chargeRequest,
  completedRequestRow,
  counterId,
  lockUsageCounters,
  MERCHANT_ONLY_PRICING,
  meterPricing,
  monthStart,
  type ChargeInput,
  type ChargeOutcome,
  type CounterKey,
  type RecordIdentity,
} from './charge.ts';
import { UnbalancedTransactionError, type Leg } from './postings.ts';
import { insertHold, releaseHoldInTransaction, type HoldRow } from './holds.ts';
import { availableOf, debitInMemory, lockWallets, releaseUnwritten, reserveUnwritten, type WalletRow } from './wallets.ts';
import { markLeaseLost, type Lease, type WalletLeases } from './leases.ts';
import { walletBalanceEvent } from './events.ts';
import { holdParts, holdRowsOf, refusedPart, type HoldPart } from './admission/decision.ts';
import { eventRows, type NewEvent } from '../webhooks/outbox.ts';

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

export type AdmitInput = {
  requestId: string;
  billing: BillingContext;
  walletId: string;
  estimate: { wallet: bigint; merchant: bigint };
  ttlMs: number;
  record: Pick<RequestRow, 'provider' | 'model' | 'endpoint' | 'provider_key_type'> & { metadata: Record<string, string> };
  /** What a spend key's checks are run against again on its locked row. */
  spendKeyRequest?: SpendKeyRequest;
  now?: Date;
};

export type AdmitOutcome =
  /** `createdAt`: the pending record's time, which the settled record keeps (and rolls up under). */
  | { outcome: 'admitted'; recordId: string; holdIds: string[]; createdAt: string }
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
    // A key that is no longer valid is refused as such, whatever its wallet holds.
    const key = await lockedSpendKey(trx, storage.dialect, input, now);
    if (key instanceof ApiError) return { outcome: 'spend_key_refused', error: key };
    const parts = holdParts(input.walletId, input.billing.merchantWalletId, input.estimate);
    const refused = refusedPart(parts, (walletId) => availableOf(wallets.get(walletId)!));
    if (refused) return { outcome: 'insufficient_balance', payer: refused.payer };
    const recordId = input.requestId;
    if (key) {
      const amount = input.estimate.wallet + input.estimate.merchant;
      const refusal = await reserveForRequest(trx, key, { recordId, amount, now });
      if (refusal) return { outcome: 'spend_key_refused', error: refusal };
    }
    const holdIds: string[] = [];
    for (const part of parts) {
      if (part.amount > 0n) {
        holdIds.push(await insertHold(trx, wallets.get(part.walletId)!, part.amount, recordId, input.ttlMs, now));
      }
    }
    const createdAt = now.toISOString();
    await insertRequestRecord(trx, pendingRecord(input, recordId, createdAt));
    return { outcome: 'admitted', recordId, holdIds, createdAt };
  });
}

/** The request's spend key, locked and checked again on its row; null without one. */
function lockedSpendKey(trx: Transaction<Database>, dialect: Storage['dialect'], input: AdmitInput, now: Date) {
  const key = input.billing.spendKey;
  return key ? lockSpendKeyForAdmission(trx, dialect, { key, request: input.spendKeyRequest ?? null, now }) : Promise.resolve(null);
}

/**
 * admitRequest for several requests in one transaction (group commit): the same decisions, taken
 * in the order given against the wallets as each earlier request left them, with each table
 * written once. Only the wallets that take a hold are locked (every customer's request names the
 * merchant's wallet; locking it always would queue them all behind one row), then the spend keys,
 * both in id order. A refusal changes nothing of its own request; the others go on.
 */
export async function admitInTransaction(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  inputs: AdmitInput[],
): Promise<AdmitOutcome[]> {
  const partsOf = inputs.map((input) => holdParts(input.walletId, input.billing.merchantWalletId, input.estimate));
  const walletIds = partsOf.flatMap((parts) => parts.map((p) => p.walletId));
  const wallets = walletIds.length > 0 ? await lockWallets(trx, dialect, walletIds) : new Map<string, WalletRow>();
  await lockSpendKeys(trx, dialect, spendKeyIdsOf(inputs));

  const outcomes: AdmitOutcome[] = [];
  const holds: HoldRow[] = [];
  const records: RequestRow[] = [];
  for (const [i, input] of inputs.entries()) {
    const parts = partsOf[i]!;
    const now = input.now ?? new Date();
    const key = await lockedSpendKey(trx, dialect, input, now);
    if (key instanceof ApiError) {
      outcomes.push({ outcome: 'spend_key_refused', error: key });
      continue;
    }
    const refused = refusedPart(parts, (walletId) => availableOf(wallets.get(walletId)!));
    if (refused) {
      outcomes.push({ outcome: 'insufficient_balance', payer: refused.payer });
      continue;
    }
    const recordId = input.requestId;
    if (key) {
      const refusal = await reserveForRequest(trx, key, { recordId, amount: input.estimate.wallet + input.estimate.merchant, now });
      if (refusal) {
        outcomes.push({ outcome: 'spend_key_refused', error: refusal });
        continue;
      }
    }
    const createdAt = now.toISOString();
    const rows = holdRowsOf(parts, recordId, now, input.ttlMs);
    for (const hold of rows) wallets.get(hold.wallet_id)!.held += hold.amount;
    holds.push(...rows);
    records.push(pendingRecord(input, recordId, createdAt));
    outcomes.push({ outcome: 'admitted', recordId, holdIds: rows.map((hold) => hold.id), createdAt });
  }

  await writeAdmissionRows(trx, holds, records);
  return outcomes;
}

/**
 * PostgreSQL fast path for a batch of admissions: one statement, committed on its own. It locks
 * the paying wallets, checks that each can cover everything the batch holds on it (then every
 * member passes admitInTransaction's check in any order), and writes the holds, the wallets'
 * `held` and the pending records. When a wallet cannot cover all of it, the statement fails on
 * purpose (division by zero), nothing is written, and the batch takes the ordinary path, which
 * decides member by member. Spend-key requests always take the ordinary path.
 */
async function admitInOneStatement(storage: Storage, inputs: AdmitInput[]): Promise<AdmitOutcome[] | null> {
  if (storage.dialect !== 'postgres' || inputs.some((input) => input.billing.spendKey)) return null;
  const need = new Map<string, bigint>();
  const holds: HoldRow[] = [];
  const records: RequestRow[] = [];
  const outcomes: AdmitOutcome[] = [];
  for (const input of inputs) {
    const now = input.now ?? new Date();
    const createdAt = now.toISOString();
    const rows = holdRowsOf(holdParts(input.walletId, input.billing.merchantWalletId, input.estimate), input.requestId, now, input.ttlMs);
    for (const hold of rows) need.set(hold.wallet_id, (need.get(hold.wallet_id) ?? 0n) + hold.amount);
    holds.push(...rows);
    records.push(pendingRecord(input, input.requestId, createdAt));
    outcomes.push({ outcome: 'admitted', recordId: input.requestId, holdIds: rows.map((hold) => hold.id), createdAt });
  }
  if (need.size === 0) return null;
  // The statement's text depends on which tables get rows, not on how many: it is prepared once.
  const json = new JsonRows();
  // What each wallet must cover, typed by the holds table's columns of the same names.
  const needRows = json.select('holds', [...need].map(([wallet_id, amount]) => ({ wallet_id, amount })));
  const metadata = metadataRows(records);
  const text = prepared(`
    with need as (${needRows}),
    locked as (select id, balance, held from wallets where id in (select wallet_id from need) order by id for update),
    ok as (
      select count(*) = (select count(*) from need) as ok
      from locked join need on need.wallet_id = locked.id
      where locked.balance - locked.held >= need.amount
    ),
    upd as (
      update wallets set held = wallets.held + need.amount from need
      where wallets.id = need.wallet_id and (select ok from ok)
      returning wallets.id
    ),
    h as (${json.insert('holds', holds)}),
    r as (${json.insert('requests', records)})
    ${metadata.length > 0 ? `, m as (${json.insert('request_metadata', metadata)})` : ''}
    select 1 / (select case when ok then 1 else 0 end from ok) as admitted`);
  await storage.db.executeQuery(CompiledQuery.raw(text, json.values));
  return outcomes;
}

/**
 * How long settlements and failures (off the response path) may wait for other work to share
 * their transaction: long enough that an idle instance writes a few requests per commit, instead
 * of making the next request's admission wait behind one.
 */
const SETTLEMENT_WAIT_MS = 25;

/**
 * How long a deferred admission stays in memory only (decision 0011). A request answered sooner
 * (most are) is written once, completed, by its settlement; a longer one gets its pending record
 * and hold rows, so it is visible and swept like any other.
 */
const ADMISSION_WRITE_DELAY_MS = 50;

/**
 * Runs work a fixed delay after it was handed in: one queue and one timer for every deferred
 * admission, instead of a timer and a chain of promises for each (every embedded request makes
 * one). Work handed in later is due later, so the queue is in due order.
 */
class DelayQueue {
  readonly #delayMs: number;
  #entries: { due: number; run: () => void }[] = [];
  #timer: NodeJS.Timeout | undefined;

  constructor(delayMs: number) {
    this.#delayMs = delayMs;
  }

  add(run: () => void): void {
    this.#entries.push({ due: performance.now() + this.#delayMs, run });
    this.#timer ??= setTimeout(() => this.#runDue(), this.#delayMs);
  }

  #runDue(): void {
    // Timers count from the event loop's clock, which may run a little behind performance.now().
    const now = performance.now() + 1;
    let count = 0;
    while (count < this.#entries.length && this.#entries[count]!.due <= now) count++;
    const due = this.#entries.splice(0, count);
    const next = this.#entries[0];
    this.#timer = next ? setTimeout(() => this.#runDue(), Math.max(1, next.due - now)) : undefined;
    for (const entry of due) entry.run();
  }
}

const admissionWriteDelay = new DelayQueue(ADMISSION_WRITE_DELAY_MS);

/**
 * What a deferred admission leaves to write: its holds and its pending record. `queued` until a
 * batch takes it (`writing`), unless its settlement comes first and takes it over (`merged`):
 * then the settled record is written directly and no hold row is ever written.
 */
export type AdmissionWrite = {
  holds: HoldRow[];
  /** The admission, from which its pending record is made when it is written (most never are). */
  admission: AdmitInput;
  createdAt: string;
  state: 'queued' | 'writing' | 'merged';
  /** Settles once the holds and the pending record are committed (or failed to be, or were merged). */
  written: Promise<void>;
  /**
   * Set when the holds were taken from wallet leases (PostgreSQL, decision 0013) instead of being
   * reserved in process: each hold's share is still in its wallet's lease row until written or settled.
   */
  leased?: { leases: WalletLeases; byWallet: Map<string, Lease> };
};

export type DeferredAdmission = AdmitOutcome & { deferred?: AdmissionWrite };

/** A settlement takes over its admission's write when no batch has taken it yet; true when it did. */
export function takeOverAdmission(write: AdmissionWrite | undefined): write is AdmissionWrite {
  if (write?.state !== 'queued') return false;
  write.state = 'merged';
  return true;
}

/** The in-memory reservation of a deferred admission ends: its holds are in `held` now, or settled. */
export function releaseDeferredHolds(write: AdmissionWrite): void {
  if (write.leased) {
    for (const lease of write.leased.byWallet.values()) write.leased.leases.end(lease);
    return;
  }
  for (const hold of write.holds) releaseUnwritten(hold.wallet_id, hold.amount);
}

/**
 * Admission decided in process, written later (decision 0011). The embedded shape (SQLite: one
 * process owns the database, DESIGN §2) takes the same decision as admitRequest against the
 * wallets as committed minus every hold this process admitted and has not written yet, with the
 * connection held so no transaction is half done while it reads; the holds are reserved in memory
 * at once. With `leases` (PostgreSQL, decision 0013) the holds are taken from this instance's
 * leases on the paying wallets instead. Either way the holds' rows and the pending record are
 * written by `writer` off the response path, batched with settlements.
 */
export async function admitDeferred(storage: Storage, writer: GroupCommitWriter, input: AdmitInput, leases?: WalletLeases): Promise<DeferredAdmission> {
  const parts = holdParts(input.walletId, input.billing.merchantWalletId, input.estimate);
  const now = input.now ?? new Date();
  const createdAt = now.toISOString();
  const recordId = input.requestId;
  const holds = holdRowsOf(parts, recordId, now, input.ttlMs);
  const deferred: AdmissionWrite = { holds, admission: input, createdAt, state: 'queued', written: Promise.resolve() };

  if (leases) {
    const taken = await takeFromLeases(leases, parts);
    if (!(taken instanceof Map)) return { outcome: 'insufficient_balance', payer: taken.payer };
    deferred.leased = { leases, byWallet: taken };
  } else {
    const refused = await reserveInProcess(storage, parts);
    if (refused) return { outcome: 'insufficient_balance', payer: refused.payer };
  }

  // Handed to the writer only once the request has run a while: most settle before that and take
  // their admission over. A merged admission's reservation ends with its settlement instead.
  deferred.written = new Promise<void>((resolve, reject) => {
    admissionWriteDelay.add(() => {
      const done = () => {
        if (deferred.state !== 'merged') releaseDeferredHolds(deferred);
      };
      if (deferred.state !== 'queued') return (done(), resolve());
      writer.run(WRITE_ADMISSION_JOB, deferred).then(
        () => (done(), resolve()),
        (error: unknown) => (done(), reject(error)),
      );
    });
  });
  // Its failure is reported where it is awaited (the settlement); never as an unhandled rejection.
  deferred.written.catch(() => undefined);
  return { outcome: 'admitted', recordId, holdIds: holds.map((hold) => hold.id), createdAt, deferred };
}

/**
 * The embedded decision: the first part its wallet cannot cover, or nothing (then all are reserved).
 * It is taken against the wallets as this process last read them while nothing was written since
 * (walletReads); a refusal is always taken against a fresh read.
 */
async function reserveInProcess(storage: Storage, parts: HoldPart[]): Promise<HoldPart | undefined> {
  const walletIds = [...new Set(parts.map((part) => part.walletId))];
  const remembered = rememberedWallets(storage, walletIds);
  if (remembered && !refusedIn(parts, remembered)) {
    reserveParts(parts);
    return undefined;
  }
  return storage.db.connection().execute(async (db) => {
    const rows = walletIds.length > 0 ? (await db.executeQuery(walletBalancesQuery(walletIds))).rows : [];
    const wallets = new Map(rows.map((row) => [row.id, row]));
    rememberWallets(storage, wallets);
    const refusal = refusedIn(parts, wallets);
    // Reserved before the connection is let go: no other decision sees these wallets without them.
    if (!refusal) reserveParts(parts);
    return refusal;
  });
}

type WalletBalance = Pick<WalletRow, 'id' | 'balance' | 'held'>;

function refusedIn(parts: HoldPart[], wallets: Map<string, WalletBalance>): HoldPart | undefined {
  return refusedPart(parts, (walletId) => availableOf(wallets.get(walletId)!));
}

function reserveParts(parts: HoldPart[]): void {
  for (const part of parts) reserveUnwritten(part.walletId, part.amount);
}

/**
 * Wallet balances as the embedded admission last read them, each with the storage's write count
 * at the time. While that count has not moved, no statement of this process has written since, so
 * no transaction is half done and the row is what the database holds — but for what another
 * process wrote meanwhile. The only other process on an embedded database is the CLI, which only
 * adds credit (decision 0011): a remembered row can make an admission refuse wrongly, never admit
 * wrongly, and refusals are taken against a fresh read. Saves a read per request (the read takes
 * SQLite's WAL read lock: system calls, ~14 µs under load).
 */
const walletReads = new WeakMap<Storage, Map<string, { row: WalletBalance; writes: number }>>();
const WALLET_READS_MAX = 10_000;

function rememberedWallets(storage: Storage, ids: string[]): Map<string, WalletBalance> | null {
  const writes = storage.writeCount?.();
  const remembered = walletReads.get(storage);
  if (writes === undefined || !remembered) return null;
  const wallets = new Map<string, WalletBalance>();
  for (const id of ids) {
    const read = remembered.get(id);
    if (read?.writes !== writes) return null;
    wallets.set(id, read.row);
  }
  return wallets;
}

function rememberWallets(storage: Storage, wallets: Map<string, WalletBalance>): void {
  const writes = storage.writeCount?.();
  if (writes === undefined) return;
  let remembered = walletReads.get(storage);
  if (!remembered || remembered.size >= WALLET_READS_MAX) walletReads.set(storage, (remembered = new Map()));
  for (const [id, row] of wallets) remembered.set(id, { row, writes });
}

/** Each part from its wallet's lease (one part per wallet); the refused part when one cannot be covered. */
async function takeFromLeases(leases: WalletLeases, parts: HoldPart[]): Promise<Map<string, Lease> | HoldPart> {
  const taken = new Map<string, Lease>();
  for (const part of parts) {
    const lease = await leases.take(part.walletId, part.amount);
    if (!lease) {
      for (const [walletId, earlier] of taken) leases.giveBack(earlier, parts.find((p) => p.walletId === walletId)!.amount);
      return part;
    }
    taken.set(part.walletId, lease);
  }
  return taken;
}

/**
 * What an admission reads of its one or two wallets, compiled once per shape: building the query
 * anew costs more than running it, and this read is on every embedded request's path.
 */
const WALLET_BALANCES_SQL = ['select id, balance, held from wallets where id = ?', 'select id, balance, held from wallets where id in (?, ?)'];

function walletBalancesQuery(ids: string[]): CompiledQuery<Pick<WalletRow, 'id' | 'balance' | 'held'>> {
  return CompiledQuery.raw(WALLET_BALANCES_SQL[ids.length - 1]!, ids) as CompiledQuery<Pick<WalletRow, 'id' | 'balance' | 'held'>>;
}

/**
 * The rows admissions leave: their holds, each wallet's `held` raised by what they hold on it, the
 * pending records and their metadata. Used by the batch admission and by deferred admission writes.
 * A hold taken from a lease is carved out of it instead: the lease row gives up its share and
 * `held` stays as it is (unless the lease expired meanwhile; then the hold is held anew).
 */
async function writeAdmissionRows(
  trx: Transaction<Database>,
  holds: HoldRow[],
  records: RequestRow[],
  leaseOf: (hold: HoldRow) => Lease | undefined = () => undefined,
): Promise<void> {
  const carved = await carveFromLeases(trx, holds, leaseOf);
  const heldBy = new Map<string, bigint>();
  for (const hold of holds) {
    if (!carved.has(hold)) heldBy.set(hold.wallet_id, (heldBy.get(hold.wallet_id) ?? 0n) + hold.amount);
  }
  if (holds.length > 0) await trx.insertInto('holds').values(holds).execute();
  for (const [walletId, amount] of [...heldBy].sort(([a], [b]) => (a < b ? -1 : 1))) {
    await trx
      .updateTable('wallets')
      .set({ held: sql<bigint>`held + ${amount}` })
      .where('id', '=', walletId)
      .execute();
  }
  if (records.length === 0) return;
  await trx.insertInto('requests').values(records).execute();
  await insertMetadataRows(trx, metadataRows(records));
}

/** Moves each leased hold's share out of its lease row; the holds whose lease was still active. */
async function carveFromLeases(trx: Transaction<Database>, holds: HoldRow[], leaseOf: (hold: HoldRow) => Lease | undefined): Promise<Set<HoldRow>> {
  const byLease = new Map<Lease, HoldRow[]>();
  for (const hold of holds) {
    const lease = leaseOf(hold);
    if (!lease) continue;
    const leased = byLease.get(lease);
    if (leased) leased.push(hold);
    else byLease.set(lease, [hold]);
  }
  const carved = new Set<HoldRow>();
  for (const [lease, leased] of byLease) {
    const share = leased.reduce((sum, hold) => sum + hold.amount, 0n);
    const shrunk = await trx
      .updateTable('holds')
      .set((eb) => ({ amount: eb('amount', '-', share) }))
      .where('id', '=', lease.holdId)
      .where('status', '=', 'active')
      .returning('id')
      .executeTakeFirst();
    if (shrunk) for (const hold of leased) carved.add(hold);
    else markLeaseLost(lease);
  }
  return carved;
}

/** The wallets deferred admission writes change: those of their holds (carved from a lease or not). */
function admissionWriteWalletIds(writes: AdmissionWrite[]): string[] {
  return writes.flatMap((write) => write.holds.map((hold) => hold.wallet_id));
}

const writeDeferredAdmissions = async (trx: Transaction<Database>, dialect: Storage['dialect'], writes: AdmissionWrite[]) => {
  // Wallets before the lease rows carving changes, as a lease's top-up and a settlement lock them.
  const walletIds = admissionWriteWalletIds(writes);
  if (dialect === 'postgres' && walletIds.length > 0) await lockWallets(trx, dialect, walletIds);
  const leaseOf = new Map<HoldRow, Lease>();
  for (const write of writes) {
    for (const hold of write.holds) {
      const lease = write.leased?.byWallet.get(hold.wallet_id);
      if (lease) leaseOf.set(hold, lease);
    }
  }
  return writeAdmissionRows(
    trx,
    writes.flatMap((write) => write.holds),
    writes.map((write) => pendingRecord(write.admission, write.admission.requestId, write.createdAt)),
    (hold) => leaseOf.get(hold),
  );
};

/** Takes the queued members of a batch for writing; merged ones are their settlement's to write. */
function takeQueued(inputs: AdmissionWrite[]): AdmissionWrite[] {
  const queued = inputs.filter((input) => input.state !== 'merged');
  for (const input of queued) input.state = 'writing';
  return queued;
}

function writeAdmissionAlone(storage: Storage, input: AdmissionWrite): Promise<void> {
  return storage.db.transaction().execute(async (trx) => {
    await writeDeferredAdmissions(trx, storage.dialect, [input]);
  });
}

/** Deferred admission writes as a group-commit job: first in a batch, so settlements find them. */
const WRITE_ADMISSION_JOB: BatchJob<AdmissionWrite, void> = {
  order: -1,
  locks: (_trx, inputs) => ({ walletIds: admissionWriteWalletIds(inputs) }),
  inTransaction: async (trx, dialect, inputs) => {
    const queued = takeQueued(inputs);
    if (queued.length > 0) await writeDeferredAdmissions(trx, dialect, queued);
    return inputs.map(() => undefined);
  },
  alone: async (storage, input) => {
    if (takeQueued([input]).length > 0) await writeAdmissionAlone(storage, input);
  },
};

/** Admission as a group-commit job (gateway/writer.ts). */
export const ADMIT_JOB: BatchJob<AdmitInput, AdmitOutcome> = {
  order: 1,
  locks: (_trx, inputs) => ({ walletIds: inputs.flatMap(payingWalletIds), spendKeyIds: spendKeyIdsOf(inputs) }),
  inTransaction: admitInTransaction,
  inOneStatement: admitInOneStatement,
  alone: admitRequest,
};

/** The wallets an admission holds anything on. */
export const payingWalletIds = (input: AdmitInput): string[] =>
  holdParts(input.walletId, input.billing.merchantWalletId, input.estimate).map((part) => part.walletId);

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
    cached_input_tokens: 0n,
    cache_write_input_tokens: 0n,
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
    endpoint: pending.endpoint,
    providerKeyType: pending.provider_key_type,
    basePrices: input.prices,
    baseCostCharged: input.baseCostCharged,
    serviceChargeRate: input.serviceChargeRate,
    metadata: pending.metadata,
    responseId: input.responseId,
    providerTimestamp: input.providerTimestamp ?? new Date().toISOString(),
    usageEstimated: input.usageEstimated,
    holdIds: input.holdIds,
    pendingRecordId: input.recordId,
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
    input.billing.spendKey ? (trx, charged) => finishReservation(trx, storage.dialect, input.recordId, spendOf(charged)) : undefined,
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
  const now = new Date();
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
  const counts = await executeWrites(trx, dialect, [...recordWrites, ...counterWrites, ...rollupWrites(trx, records), ...insertWrites(dialect, mergedRecords)]);
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
    const merchantId = input.billing.merchantId;
    const legs: Leg[] = [
      ...debitInMemory(customerWallet, price.totals.wallet),
      ...debitInMemory(merchantWallet, price.totals.merchant),
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
        .set({ balance: wallet.balance, cycle_credit: wallet.cycle_credit, bundle_credit: wallet.bundle_credit, held: wallet.held })
        .where('id', '=', wallet.id),
    }));
  const leaseWrites: Write[] = [...leaseShrinks].map(([lease, amount]) => ({
    query: trx
      .updateTable('holds')
      .set((eb) => ({ amount: eb('amount', '-', amount) }))
      .where('id', '=', lease.holdId)
      .where('status', '=', 'active')
      .returning('id'),
    counted: true,
  }));
  const written = await executeWrites(trx, dialect, [
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
  for (const { input, outcome } of withKeys) await finishReservation(trx, dialect, input.recordId, spendOf(outcome));
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
    lease.free -= extra;
    wallet.held -= hold.amount + extra;
    shrinks.set(lease, (shrinks.get(lease) ?? 0n) + hold.amount + extra);
  }
}

const walletState = (w: WalletRow) => `${w.balance} ${w.cycle_credit} ${w.bundle_credit} ${w.held}`;

/** Settled records whose admissions were never written (merged): the records and their metadata. */
function insertWrites(dialect: Storage['dialect'], records: RequestRow[]): Write[] {
  if (records.length === 0) return [];
  const metadata = metadataRows(records);
  return [insertRows(dialect, 'requests', records), ...(metadata.length > 0 ? [insertRows(dialect, 'request_metadata', metadata)] : [])];
}

/** Balanced ledger transactions (legs summing to zero, zero legs left out): their two inserts. */
function ledgerWrites(
  dialect: Storage['dialect'],
  transactions: { id: string; reference: string; description: string; merchantId: string; legs: Leg[] }[],
  at: string,
): Write[] {
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

/**
 * A write of a batch: a Kysely query, or a multi-row insert made without Kysely (on SQLite its
 * chunks' statements, on PostgreSQL one statement with the rows as JSON). `counted` ones return a
 * row per row they changed.
 */
type Write = { counted?: boolean } & (
  | { query: Compilable & { execute(): Promise<unknown[]> }; sqlite?: never; json?: never }
  | { sqlite: CompiledQuery[]; query?: never; json?: never }
  | { json: RawBuilder<unknown>; query?: never; sqlite?: never }
);

function insertRows<T extends 'requests' | 'request_metadata' | 'ledger_transactions' | 'ledger_postings' | 'events'>(
  dialect: Storage['dialect'],
  table: T,
  rows: Insertable<Database[T]>[],
): Write {
  return dialect === 'sqlite' ? { sqlite: valuesInserts(table, rows) } : { json: jsonInsert(table, rows) };
}

/**
 * Runs a batch's writes. On PostgreSQL they go as one statement (each a data-modifying CTE), so
 * the batch pays one round trip for them; on SQLite one after the other (no round trips there).
 * Returns, for each counted write, how many rows it changed.
 */
async function executeWrites(trx: Transaction<Database>, dialect: Storage['dialect'], writes: Write[]): Promise<number[]> {
  if (dialect === 'sqlite' || writes.length === 1) {
    const counts: number[] = [];
    for (const write of writes) {
      if (write.sqlite) {
        for (const insert of write.sqlite) await trx.executeQuery(insert);
        counts.push(0);
      } else if (write.json) {
        await write.json.execute(trx);
        counts.push(0);
      } else {
        const rows = await write.query.execute();
        counts.push(write.counted ? rows.length : 0);
      }
    }
    return counts;
  }
  if (writes.length === 0) return [];
  const name = (i: number) => sql.ref(`w${i}`);
  const ctes = sql.join(writes.map((write, i) => sql`${name(i)} as (${write.json ?? write.query!})`));
  const counted = writes.map((write, i) => (write.counted ? sql`(select count(*) from ${name(i)})` : sql`0`));
  // An array, not a function of one argument per write: PostgreSQL functions take at most 100
  // arguments, and a batch of 256 settlements updates as many pending records.
  const { rows } = await sql<{ counts: string }>`with ${ctes} select array_to_string(array[${sql.join(counted)}]::bigint[], ',') as counts`.execute(trx);
  return rows[0]!.counts.split(',').map(Number);
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
function rollupWrites(trx: Transaction<Database>, records: RequestRow[]): Write[] {
  const rollups = rollupAdditions(records);
  const metadataRollups = metadataRollupAdditions(records);
  if (metadataRollups.length * 14 > METADATA_ROLLUP_PARAMETER_BUDGET) throw new RunAlone();
  const writes: Write[] = [];
  if (rollups.length > 0) writes.push({ query: rollupUpsert(trx, rollups) });
  if (metadataRollups.length > 0) writes.push({ query: metadataRollupUpsert(trx, metadataRollups) });
  return writes;
}

/** The upstream failed (or the hold expired): release the holds, record `error`, charge nothing. */
export async function failRequest(storage: Storage, input: FailInput): Promise<void> {
  await storage.db.transaction().execute((trx) => failInTransaction(trx, storage.dialect, [input]));
}

export type FailInput = { recordId: string; holdIds: string[] };

async function failInTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: FailInput[]): Promise<void[]> {
  const at = new Date().toISOString();
  const holds = await holdsOf(trx, inputs.flatMap((input) => input.holdIds));
  // Every member's wallets at once, in the global order, before any record or rollup is written.
  const wallets = holds.length ? await lockWallets(trx, dialect, holds.map((h) => h.wallet_id)) : new Map<string, WalletRow>();
  const found = new Set(holds.map((hold) => hold.id));
  for (const input of inputs) {
    for (const holdId of input.holdIds) {
      if (found.has(holdId)) await releaseHoldInTransaction(trx, holdId, 'released', wallets);
    }
    await failPendingRecord(trx, input.recordId, at);
    await finishReservation(trx, dialect, input.recordId, 0n);
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
    const periodStart = monthStart(new Date());
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
function spendKeyIdsOf(inputs: { billing: BillingContext }[]): string[] {
  return inputs.flatMap((input) => (input.billing.spendKey ? [input.billing.spendKey.id] : []));
}

/** The spend keys that hold a reservation for these records (a failure knows only its record). */
async function reservedSpendKeyIds(trx: Transaction<Database>, recordIds: string[]): Promise<string[]> {
  if (recordIds.length === 0) return [];
  const rows = await trx.selectFrom('spend_key_reservations').select('spend_key_id').where('request_pk', 'in', recordIds).execute();
  return rows.map((row) => row.spend_key_id);
}
