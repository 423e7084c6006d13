import type { Transaction } from 'kysely';
import type { Storage } from '../storage/db.ts';
import type { Database } from '../storage/schema.ts';
import { exactSumColumns, exactSumForOrdering, exactSumOf } from '../storage/exact-sum.ts';
import { BUCKET_ORDER, parseWalletAccount, walletAccount, type Bucket } from './accounts.ts';

export type LedgerProblem = { kind: 'unbalanced_transaction' | 'wallet_mismatch' | 'held_mismatch'; id: string; detail: string };

export type VerifyProgress = { transactions: number; wallets: number };

export type VerifyOptions = {
  /** Called for each problem as it is found (the CLI prints them as they come). */
  onProblem?: (problem: LedgerProblem) => void;
  /** Called after each chunk of transactions or wallets checked. */
  onProgress?: (progress: VerifyProgress) => void;
};

export type VerifyResult = {
  /** The first MAX_PROBLEMS_KEPT problems found; `problemCount` counts them all. */
  problems: LedgerProblem[];
  problemCount: number;
  wallets: number;
  transactions: number;
};

/** Postings per chunk of the transaction check. */
const POSTINGS_PER_CHUNK = 50_000;
/** Wallets per chunk of the wallet check (three accounts each go into one statement's parameters). */
const WALLETS_PER_CHUNK = 500;
/** A ledger broken everywhere would otherwise fill memory with its problems. */
const MAX_PROBLEMS_KEPT = 1_000;

/**
 * Rebuilds every wallet balance from the postings and every hold total from the holds, and
 * compares them with the stored projections. An empty list means the ledger is consistent.
 *
 * Memory stays the same at any ledger size: the database sums, chunk by chunk in key order, and
 * answers with the unbalanced transactions only; wallets are compared a page at a time.
 */
export async function verifyLedger(storage: Storage, options: VerifyOptions = {}): Promise<VerifyResult> {
  const result: VerifyResult = { problems: [], problemCount: 0, wallets: 0, transactions: 0 };
  const report = (problem: LedgerProblem) => {
    result.problemCount += 1;
    if (result.problems.length < MAX_PROBLEMS_KEPT) result.problems.push(problem);
    options.onProblem?.(problem);
  };
  const progress = () => options.onProgress?.({ transactions: result.transactions, wallets: result.wallets });

  for (let after: string | null = null; ; ) {
    const chunk = await checkTransactionChunk(storage, after, report);
    result.transactions += chunk.transactions;
    progress();
    if (chunk.lastId === null) break;
    after = chunk.lastId;
  }
  for (let after: string | null = null; ; ) {
    const chunk = await checkWalletChunk(storage, after, report);
    result.wallets += chunk.wallets;
    progress();
    if (chunk.lastId === null) break;
    after = chunk.lastId;
  }
  return result;
}

/**
 * The transactions after `after` whose postings number about POSTINGS_PER_CHUNK (a transaction is
 * never split between chunks). Returns the chunk's last transaction id, null when it was the last.
 */
async function checkTransactionChunk(
  storage: Storage,
  after: string | null,
  report: (p: LedgerProblem) => void,
): Promise<{ transactions: number; lastId: string | null }> {
  const db = storage.db;
  const end = await db
    .selectFrom('ledger_postings')
    .select('transaction_id')
    .$if(after !== null, (q) => q.where('transaction_id', '>', after!))
    .orderBy('transaction_id')
    .limit(1)
    .offset(POSTINGS_PER_CHUNK - 1)
    .executeTakeFirst();
  const lastId = end?.transaction_id ?? null;

  const counted = await db
    .selectFrom('ledger_postings')
    .select((eb) => eb.fn.count<string | number | bigint>('transaction_id').distinct().as('n'))
    .$if(after !== null, (q) => q.where('transaction_id', '>', after!))
    .$if(lastId !== null, (q) => q.where('transaction_id', '<=', lastId!))
    .executeTakeFirstOrThrow();

  // The HAVING test is exact on PostgreSQL; on SQLite it is a double that is 0 exactly when the
  // legs balance, so nothing balanced is missed, and the exact bigint total below decides.
  const candidates = await db
    .selectFrom('ledger_postings')
    .select(['transaction_id', ...exactSumColumns('amount', 'total')])
    .$if(after !== null, (q) => q.where('transaction_id', '>', after!))
    .$if(lastId !== null, (q) => q.where('transaction_id', '<=', lastId!))
    .groupBy('transaction_id')
    .having(({ eb }) => eb(exactSumForOrdering('amount'), '<>', 0))
    .orderBy('transaction_id')
    .execute();
  for (const c of candidates) {
    const total = exactSumOf(c, 'total');
    if (total !== 0n) report({ kind: 'unbalanced_transaction', id: c.transaction_id, detail: `legs sum to ${total}` });
  }
  return { transactions: Number(counted.n), lastId };
}

/**
 * The next WALLETS_PER_CHUNK wallets after `after`, compared with their postings and holds, all
 * read in one snapshot: read one statement after another, a hold released or a charge committed
 * between the wallet read and the holds read (leases come and go all the time on a live
 * gateway) would show as a mismatch that is not there. PostgreSQL reads the chunk in one
 * REPEATABLE READ transaction, read only (it waits for no lock and takes none that writers wait
 * for); SQLite in one transaction, which keeps writers out for the few milliseconds it lasts.
 */
async function checkWalletChunk(
  storage: Storage,
  after: string | null,
  report: (p: LedgerProblem) => void,
): Promise<{ wallets: number; lastId: string | null }> {
  const snapshot = storage.dialect === 'postgres' ? storage.db.transaction().setIsolationLevel('repeatable read').setAccessMode('read only') : storage.db.transaction();
  return snapshot.execute((trx) => compareWalletChunk(trx, after, report));
}

async function compareWalletChunk(
  db: Transaction<Database>,
  after: string | null,
  report: (p: LedgerProblem) => void,
): Promise<{ wallets: number; lastId: string | null }> {
  const wallets = await db
    .selectFrom('wallets')
    .select(['id', 'balance', 'cycle_credit', 'bundle_credit', 'held'])
    .$if(after !== null, (q) => q.where('id', '>', after!))
    .orderBy('id')
    .limit(WALLETS_PER_CHUNK)
    .execute();
  if (wallets.length === 0) return { wallets: 0, lastId: null };
  const ids = wallets.map((w) => w.id);

  const byAccount = await db
    .selectFrom('ledger_postings')
    .select(['account', ...exactSumColumns('amount', 'total')])
    .where('account', 'in', ids.flatMap((id) => BUCKET_ORDER.map((b) => walletAccount(id, b))))
    .groupBy('account')
    .execute();
  const rebuilt = new Map<string, Record<Bucket, bigint>>();
  for (const row of byAccount) {
    const parsed = parseWalletAccount(row.account);
    if (!parsed) continue;
    const buckets = rebuilt.get(parsed.walletId) ?? { cycle: 0n, bundle: 0n, prepaid: 0n };
    buckets[parsed.bucket] += exactSumOf(row, 'total');
    rebuilt.set(parsed.walletId, buckets);
  }

  const holds = await db
    .selectFrom('holds')
    .select(['wallet_id', ...exactSumColumns('amount', 'total')])
    .where('wallet_id', 'in', ids)
    .where('status', '=', 'active')
    .groupBy('wallet_id')
    .execute();
  const heldByWallet = new Map(holds.map((h) => [h.wallet_id, exactSumOf(h, 'total')]));

  for (const w of wallets) {
    const b = rebuilt.get(w.id) ?? { cycle: 0n, bundle: 0n, prepaid: 0n };
    const total = b.cycle + b.bundle + b.prepaid;
    const stored = { balance: BigInt(w.balance), cycle: BigInt(w.cycle_credit), bundle: BigInt(w.bundle_credit) };
    if (total !== stored.balance || b.cycle !== stored.cycle || b.bundle !== stored.bundle) {
      report({
        kind: 'wallet_mismatch',
        id: w.id,
        detail: `stored balance ${stored.balance} (cycle ${stored.cycle}, bundle ${stored.bundle}); postings give ${total} (cycle ${b.cycle}, bundle ${b.bundle})`,
      });
    }
    const held = heldByWallet.get(w.id) ?? 0n;
    if (held !== BigInt(w.held)) report({ kind: 'held_mismatch', id: w.id, detail: `stored held ${w.held}; active holds sum to ${held}` });
  }
  return { wallets: wallets.length, lastId: wallets.length < WALLETS_PER_CHUNK ? null : wallets[wallets.length - 1]!.id };
}
