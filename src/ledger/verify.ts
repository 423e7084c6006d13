import type { Storage } from '../storage/db.ts';
import { exactSumColumns, exactSumOf } from '../storage/exact-sum.ts';
import { BUCKET_ORDER, parseWalletAccount, type Bucket } from './accounts.ts';

export type LedgerProblem = { kind: 'unbalanced_transaction' | 'wallet_mismatch' | 'held_mismatch'; id: string; detail: string };

/**
 * Rebuilds every wallet balance from the postings and every hold total from the holds, and
 * compares them with the stored projections. An empty list means the ledger is consistent.
 */
export async function verifyLedger(storage: Storage): Promise<{ problems: LedgerProblem[]; wallets: number; transactions: number }> {
  const problems: LedgerProblem[] = [];
  const db = storage.db;

  const sums = await db
    .selectFrom('ledger_postings')
    .select(['transaction_id', ...exactSumColumns('amount', 'total')])
    .groupBy('transaction_id')
    .execute();
  for (const s of sums) {
    const total = exactSumOf(s, 'total');
    if (total !== 0n) problems.push({ kind: 'unbalanced_transaction', id: s.transaction_id, detail: `legs sum to ${total}` });
  }

  const byAccount = await db
    .selectFrom('ledger_postings')
    .select(['account', ...exactSumColumns('amount', 'total')])
    .where('account', 'like', 'wallet:%')
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

  const heldByWallet = new Map<string, bigint>();
  const holds = await db
    .selectFrom('holds')
    .select(['wallet_id', ...exactSumColumns('amount', 'total')])
    .where('status', '=', 'active')
    .groupBy('wallet_id')
    .execute();
  for (const h of holds) heldByWallet.set(h.wallet_id, exactSumOf(h, 'total'));

  const wallets = await db.selectFrom('wallets').select(['id', 'balance', 'cycle_credit', 'bundle_credit', 'held']).execute();
  for (const w of wallets) {
    const b = rebuilt.get(w.id) ?? { cycle: 0n, bundle: 0n, prepaid: 0n };
    const total = BUCKET_ORDER.reduce((acc, k) => acc + b[k], 0n);
    const stored = { balance: BigInt(w.balance), cycle: BigInt(w.cycle_credit), bundle: BigInt(w.bundle_credit) };
    if (total !== stored.balance || b.cycle !== stored.cycle || b.bundle !== stored.bundle) {
      problems.push({
        kind: 'wallet_mismatch',
        id: w.id,
        detail: `stored balance ${stored.balance} (cycle ${stored.cycle}, bundle ${stored.bundle}); postings give ${total} (cycle ${b.cycle}, bundle ${b.bundle})`,
      });
    }
    const held = heldByWallet.get(w.id) ?? 0n;
    if (held !== BigInt(w.held)) problems.push({ kind: 'held_mismatch', id: w.id, detail: `stored held ${w.held}; active holds sum to ${held}` });
  }
  return { problems, wallets: wallets.length, transactions: sums.length };
}
