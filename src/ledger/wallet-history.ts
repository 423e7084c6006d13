import type { Storage } from '../storage/db.ts';
import { BUCKET_ORDER, parseWalletAccount, walletAccount, type Bucket } from './accounts.ts';
import type { WalletRow } from './wallets.ts';
import { availableOf } from './decide/balance.ts';

/**
 * Read side of a wallet for the dashboard: its balance split into buckets, and the credit that
 * came into it (grants, operator credit, payments, plan credit), straight from the ledger.
 */
export type WalletBuckets = { balance: bigint; prepaid: bigint; cycle: bigint; bundle: bigint; held: bigint; available: bigint };

/** The ledger kinds that put money into a wallet. */
const CREDIT_KINDS = ['credit_grant', 'operator_credit', 'customer_payment', 'plan_credit'] as const;

export function bucketsOf(w: WalletRow): WalletBuckets {
  const [balance, cycle, bundle, held] = [BigInt(w.balance), BigInt(w.cycle_credit), BigInt(w.bundle_credit), BigInt(w.held)];
  return { balance, cycle, bundle, prepaid: balance - cycle - bundle, held, available: availableOf({ id: w.id, balance, held }, null) };
}

/** The buckets of several of a merchant's wallets, by wallet id. */
export async function walletBuckets(storage: Storage, merchantId: string, walletIds: string[]): Promise<Map<string, WalletBuckets>> {
  if (walletIds.length === 0) return new Map();
  const rows = await storage.db.selectFrom('wallets').selectAll().where('merchant_id', '=', merchantId).where('id', 'in', walletIds).execute();
  return new Map(rows.map((w) => [w.id, bucketsOf(w)]));
}

export type WalletCredit = { transactionId: string; kind: string; bucket: Bucket; amount: bigint; description: string | null; createdAt: string };

/** The newest credits into a wallet, newest first. */
export async function walletCredits(storage: Storage, merchantId: string, walletId: string, limit: number): Promise<WalletCredit[]> {
  const rows = await storage.db
    .selectFrom('ledger_postings as p')
    .innerJoin('ledger_transactions as t', 't.id', 'p.transaction_id')
    .select(['t.id', 't.kind', 't.description', 'p.account', 'p.amount', 't.created_at'])
    .where('p.account', 'in', BUCKET_ORDER.map((b) => walletAccount(walletId, b)))
    .where('p.amount', '>', 0n)
    .where('t.merchant_id', '=', merchantId)
    .where('t.kind', 'in', [...CREDIT_KINDS])
    .orderBy('t.created_at', 'desc')
    .orderBy('t.id', 'desc')
    .limit(limit)
    .execute();
  return rows.map((r) => ({
    transactionId: r.id,
    kind: r.kind,
    bucket: parseWalletAccount(r.account)?.bucket ?? 'prepaid',
    amount: BigInt(r.amount),
    description: r.description,
    createdAt: r.created_at,
  }));
}
