import type { FastifyBaseLogger } from 'fastify';
import { newId } from '../domain/ids.ts';
import type { PricedRequest } from '../domain/pricing.ts';
import type { BatchRows } from '../storage/batch-write.ts';
import type { Storage } from '../storage/db.ts';
import { metadataRows } from '../storage/requests.ts';
import { planCreditKey } from '../storage/subscriptions.ts';
import { eventRows } from '../webhooks/outbox.ts';
import { batchTime, postCharge, type ChargeInput, type ChargeOutcome, type PostedCharge } from './charge.ts';
import { balanceShortfall, mayChargeMerchantWallet, payerWalletOf, priceCharge, walletsDebitedBy } from './decide/charge.ts';
import { drawsPlanCredit } from './decide/balance.ts';
import { counterAt, counterId, counterKeyOf, counterRow, type CounterKey } from './tier-counters.ts';
import { BalanceChanges } from './events.ts';
import { GroupCommitWriter, type BatchJob } from './group-commit.ts';
import { ledgerRows } from './postings.ts';
import type { WalletRow } from './wallets.ts';
import { inChargeBatchTransaction } from './store/postgres.ts';
import { chargeBatchSteps } from './store/sqlite.ts';
import type { ChargeBatchSteps } from './store/types.ts';

/**
 * A batch takes every request waiting, up to a budget of statement parameters: a request writes
 * about a hundred, plus nineteen per metadata pair (five for its metadata row, fourteen for its
 * metadata rollup row). The budget stays below SQLite's 32,766 parameters per statement and
 * PostgreSQL's 65,535.
 */
const MAX_BATCH_PARAMETERS = 30_000;

/**
 * POST /requests charges as a group-commit job: charges that arrive while a batch is being
 * written wait and then go together in the next one (chargeBatch: one transaction, a fixed number
 * of statements, every decision under the batch's row locks). A batch holds one request per
 * (merchant, request_id); a copy waits for the first: if that one is recorded, the copy is a
 * duplicate (the route answers it by reading the stored record back), otherwise it is tried in the
 * next batch. A batch that fails as a whole charges each request in a batch of its own.
 */
export const CHARGE_JOB: BatchJob<ChargeInput, BatchOutcome> = {
  order: 0,
  wholeBatch: (storage, inputs) => chargeBatch(storage, inputs),
  alone: async (storage, input) => (await chargeBatch(storage, [input]))[0]!,
  sizeOf: (input) => 100 + 19 * Object.keys(input.metadata).length,
  copies: {
    keyOf: (input) => `${input.merchant.id}\n${input.requestId}`,
    answerCopy: (first) => (first.outcome === 'recorded' ? { outcome: 'duplicate' } : undefined),
  },
};

/**
 * The writer of POST /requests charges. On PostgreSQL two batches are written at once, so that one
 * is built and answered in this process while the database runs the other (decision 0012: ~15 %
 * more requests per second than one at a time). They cannot deadlock: each locks its tier counters
 * and then its wallets in one global order before writing, and everything else it writes belongs
 * to the customers whose wallets it locked. On SQLite (one writer) one batch at a time.
 */
export function chargeWriter(storage: Storage, log?: Pick<FastifyBaseLogger, 'warn'>): GroupCommitWriter {
  return new GroupCommitWriter(storage, log, { maxBatch: MAX_BATCH_PARAMETERS, batchesInFlight: storage.pipeline ? 2 : 1 });
}

type Refusal = Extract<ChargeOutcome, { outcome: 'insufficient_balance' }>;

/**
 * What a batch answers for each request: a charge outcome, or that its customer or meter is gone.
 * A refusal says whether the request drew plan credit (the batch decided it).
 */
export type BatchOutcome =
  | Exclude<ChargeOutcome, Refusal>
  | (Refusal & { drawsPlanCredit: boolean })
  | { outcome: 'customer_deleted' }
  | { outcome: 'meter_deleted' };

/**
 * Charges several POST /requests at once, in one database transaction: the same decisions
 * `chargeRequest` makes for each, taken in the order given, with each table written once for the
 * whole batch. A request that cannot be paid (or prices too high) is refused alone; the others
 * are unaffected. A request whose request_id turns out to be recorded already is answered
 * `duplicate` and the batch is retried without it, so nothing of it is written.
 *
 * Callers may hand in customers and meters they remembered: the batch prices with the meters as
 * they are now (read anew by id) and answers `customer_deleted` / `meter_deleted` for a request
 * whose customer or meter was deleted since.
 *
 * Whether a request draws its customer's plan credit is the batch's own decision, read with the
 * wallets it locks (the customer's live subscription's plan links the meter; decision 0016); a
 * caller's `drawsPlanCredit` is not used. A wallet refusal says what was decided, for auto top-up.
 *
 * Only charges without holds or pending records belong here (POST /requests).
 */
export async function chargeBatch(storage: Storage, inputs: ChargeInput[], now = batchTime(inputs)): Promise<BatchOutcome[]> {
  if (inputs.some((input) => input.holdId || input.holdIds?.length || input.pendingRecordId)) {
    throw new Error('a batch takes no holds or pending records');
  }
  const duplicates = new Set<ChargeInput>();
  for (;;) {
    const attempt = await inBatchTransaction(storage, (steps) => chargeBatchInTransaction(steps, { inputs, duplicates, now })).catch(
      (e: unknown) => {
        if (e instanceof RequestIdsTaken) return e;
        throw e;
      },
    );
    if (!(attempt instanceof RequestIdsTaken)) return attempt;
    // Each retry drops at least one request, so this ends.
    for (const input of attempt.inputs) duplicates.add(input);
  }
}

/** Rolls the batch back: some records' request_ids were taken by a transaction that committed first. */
class RequestIdsTaken extends Error {
  constructor(readonly inputs: ChargeInput[]) {
    super('request ids taken');
  }
}


/**
 * A batch's transaction and its two steps, from the engine's store: on PostgreSQL pipelined (two
 * round trips), on SQLite an ordinary transaction.
 */
function inBatchTransaction<T>(storage: Storage, work: (steps: ChargeBatchSteps) => Promise<T>): Promise<T> {
  const pool = storage.pipeline;
  if (pool) return inChargeBatchTransaction(storage, pool, work);
  return storage.db.transaction().execute((trx) => work(chargeBatchSteps(trx)));
}

type Charged = PostedCharge & {
  /** The request as priced: with the meter as it is now. */
  input: ChargeInput;
  priced: PricedRequest;
  customerWallet: WalletRow;
  merchantWallet: WalletRow | undefined;
};

type Attempt = { inputs: ChargeInput[]; duplicates: Set<ChargeInput>; now: Date };

async function chargeBatchInTransaction(steps: ChargeBatchSteps, { inputs, duplicates, now }: Attempt): Promise<BatchOutcome[]> {
  const at = now.toISOString();
  const live = inputs.filter((input) => !duplicates.has(input));

  // Locks in one global order — tier counters by key, then wallets by id — as chargeRequest does.
  const counterKeys = new Map<ChargeInput, CounterKey>();
  for (const input of live) {
    const key = counterKeyOf(input, now);
    if (key) counterKeys.set(input, key);
  }
  const walletIds = live.flatMap((input) => [payerWalletOf(input), ...(mayChargeMerchantWallet(input) ? [input.merchant.wallet_id] : [])]);
  const meterIds = [...new Set(live.flatMap((input) => (input.meter ? [input.meter.id] : [])))];
  const { positions, wallets, liveCustomers, drawingPlanCredit, meters: liveMeters } = await steps.lock([...counterKeys.values()], walletIds, meterIds);

  const outcomes = new Map<ChargeInput, BatchOutcome>();
  const charged: Charged[] = [];
  const sources = new Map<Charged, ChargeInput>();
  const changedCounters = new Map<string, CounterKey & { units: bigint }>();
  for (const input of live) {
    if (input.connection && !liveCustomers.has(input.connection.id)) {
      outcomes.set(input, { outcome: 'customer_deleted' });
      continue;
    }
    const meter = input.meter && liveMeters.get(input.meter.id);
    if (meter === undefined) {
      outcomes.set(input, { outcome: 'meter_deleted' });
      continue;
    }
    const key = counterKeys.get(input);
    const drawsPlan = !!input.connection && !!meter && drawingPlanCredit.has(planCreditKey({ connectionId: input.connection.id, meterId: meter.id }));
    const decision = decide(Object.assign({}, input, { meter, drawsPlanCredit: drawsPlan }), key ? (positions.get(counterId(key)) ?? 0n) : 0n, wallets, at);
    if ('outcome' in decision) {
      outcomes.set(input, decision);
      continue;
    }
    charged.push(decision);
    sources.set(decision, input);
    outcomes.set(input, { outcome: 'recorded', row: decision.record, priced: decision.priced });
    if (key) {
      positions.set(counterId(key), decision.priced.accumulatedUnits);
      changedCounters.set(counterId(key), counterAt(key, decision.priced.accumulatedUnits));
    }
  }

  const { taken } = await steps.write(batchRows(charged, [...changedCounters.values()], at));
  if (taken.length > 0) {
    const takenIds = new Set(taken);
    throw new RequestIdsTaken(charged.filter((c) => takenIds.has(c.record.id)).map((c) => sources.get(c)!));
  }
  return inputs.map((input) => (duplicates.has(input) ? { outcome: 'duplicate' } : outcomes.get(input)!));
}


/**
 * Prices one request at the current position and, when its wallets can pay, debits them in memory
 * and builds everything that records it. A refusal changes nothing.
 */
function decide(
  input: ChargeInput,
  accumulated: bigint,
  wallets: Map<string, WalletRow>,
  at: string,
): Charged | Exclude<BatchOutcome, { outcome: 'recorded' | 'duplicate' | 'customer_deleted' | 'meter_deleted' }> {
  const priced = priceCharge(input, accumulated);
  if (priced === 'amount_too_large') return { outcome: 'amount_too_large' };
  const customerWallet = wallets.get(payerWalletOf(input))!;
  const merchantWallet = wallets.get(input.merchant.wallet_id);
  const refusal = balanceShortfall(priced, customerWallet, merchantWallet, input);
  if (refusal) return { outcome: 'insufficient_balance', ...refusal, drawsPlanCredit: drawsPlanCredit(input) };

  const { record, transaction } = postCharge(input, priced, newId('request'), customerWallet, merchantWallet, at);
  return { input, priced, record, transaction, customerWallet, merchantWallet };
}

/**
 * Everything the charged requests write: records, metadata, rollups, balances, tier positions,
 * ledger, and one balance event per wallet the batch changed (BalanceChanges), with the balance
 * the batch left it.
 */
function batchRows(charged: Charged[], counters: (CounterKey & { units: bigint })[], at: string): BatchRows {
  const records = charged.map((c) => c.record);
  const ledger = ledgerRows(charged.map((c) => c.transaction));
  const debited = new Set<WalletRow>();
  const changes = new BalanceChanges();
  for (const { input, priced, customerWallet, merchantWallet } of charged) {
    for (const wallet of walletsDebitedBy(priced, customerWallet, merchantWallet)) debited.add(wallet);
    changes.noteCharge(input, priced, customerWallet, merchantWallet, false);
  }
  return {
    requests: records,
    metadata: metadataRows(records),
    wallets: [...debited].sort((a, b) => (a.id < b.id ? -1 : 1)),
    counters: [...counters]
      .sort((a, b) => (counterId(a) < counterId(b) ? -1 : 1))
      .map((c) => counterRow(c, c.units)),
    transactions: ledger.transactions,
    postings: ledger.postings,
    events: eventRows(changes.events(at)),
  };
}
