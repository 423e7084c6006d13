import type { Transaction } from 'kysely';
import { formatMoney, MAX_WALLET_BALANCE_UNITS } from '../domain/money.ts';
import type { Storage } from '../storage/db.ts';
import type { Database, WalletsTable } from '../storage/schema.ts';
import { creditGrantsAccount, operatorFundingAccount, walletAccount, type Bucket } from './accounts.ts';
import { appendTransaction } from './store/common.ts';
import { inLockOrder } from './decide/lock-order.ts';
import { recordBalanceEvent } from './events.ts';

/**
 * Wallets and their balances. The ledger modules are the only code that changes a balance, and
 * every change is a balanced ledger transaction written in the same database transaction.
 */
export type WalletRow = WalletsTable;

export async function findWallet(storage: Storage, id: string): Promise<WalletRow | undefined> {
  return storage.db.selectFrom('wallets').selectAll().where('id', '=', id).executeTakeFirst();
}

/**
 * Reads wallets for change inside a transaction, locking them on PostgreSQL in id order so that
 * concurrent transactions touching the same wallets cannot deadlock. (SQLite transactions already
 * hold the database's write lock.)
 */
export async function lockWallets(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  ids: string[],
): Promise<Map<string, WalletRow>> {
  const unique = inLockOrder(ids);
  const rows = await trx
    .selectFrom('wallets')
    .selectAll()
    .where('id', 'in', unique)
    .orderBy('id')
    .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
    .execute();
  return new Map(rows.map((r) => [r.id, r]));
}

/**
 * Holds an app admitted in process whose rows are not written yet (the embedded shape writes them
 * off the response path; decision 0011), by wallet. One per app, created by buildApp and handed to
 * every path that spends (the gateway's admissions, POST /requests): each subtracts them, so money
 * a request in flight may spend is never spent twice. Never filled on PostgreSQL (leases are rows).
 */
export class UnwrittenHolds {
  readonly #byWallet = new Map<string, bigint>();

  reserve(walletId: string, amount: bigint): void {
    this.#byWallet.set(walletId, (this.#byWallet.get(walletId) ?? 0n) + amount);
  }

  /** The hold's row is committed (its amount is in `held` now), or it never will be. */
  release(walletId: string, amount: bigint): void {
    const left = (this.#byWallet.get(walletId) ?? 0n) - amount;
    if (left > 0n) this.#byWallet.set(walletId, left);
    else this.#byWallet.delete(walletId);
  }

  on(walletId: string): bigint {
    return this.#byWallet.get(walletId) ?? 0n;
  }
}

/** Writes back the balances a debit in memory (decide/balance.ts debitInMemory) left on a locked wallet. */
export async function saveBalance(trx: Transaction<Database>, wallet: WalletRow): Promise<void> {
  await trx
    .updateTable('wallets')
    .set({ balance: wallet.balance, cycle_credit: wallet.cycle_credit, bundle_credit: wallet.bundle_credit })
    .where('id', '=', wallet.id)
    .execute();
}

/** A credit would take a wallet's balance above the most it may hold. */
export class WalletBalanceLimitError extends Error {
  constructor(readonly ceiling: bigint) {
    super(`the credit would take the wallet balance above ${formatMoney(ceiling)}`);
  }
}

/**
 * Adds to one bucket of a wallet (prepaid unless told) inside a transaction; returns the new
 * balance, or null if there is no such wallet. The balance is the sum of the buckets, so it grows
 * with any of them. A credit that would take the balance above `ceiling` changes nothing and
 * throws WalletBalanceLimitError: the check is in the update itself, so concurrent credits cannot
 * pass it together.
 */
export async function applyCredit(
  trx: Transaction<Database>,
  walletId: string,
  amount: bigint,
  bucket: Bucket = 'prepaid',
  ceiling: bigint = MAX_WALLET_BALANCE_UNITS,
): Promise<bigint | null> {
  const row = await trx
    .updateTable('wallets')
    .set((eb) => ({
      balance: eb('balance', '+', amount),
      ...(bucket === 'cycle' ? { cycle_credit: eb('cycle_credit', '+', amount) } : {}),
      ...(bucket === 'bundle' ? { bundle_credit: eb('bundle_credit', '+', amount) } : {}),
    }))
    .where('id', '=', walletId)
    .where('balance', '<=', ceiling - amount)
    .returning(['balance'])
    .executeTakeFirst();
  if (row) return BigInt(row.balance);
  const exists = await trx.selectFrom('wallets').select('id').where('id', '=', walletId).executeTakeFirst();
  if (exists) throw new WalletBalanceLimitError(ceiling);
  return null;
}

/**
 * How much a wallet can still take before it reaches the maximum balance. It reads the balance
 * with an update that changes nothing, so PostgreSQL keeps the row locked until the caller's
 * credit is written (SQLite transactions hold the write lock already).
 */
export async function creditRoom(trx: Transaction<Database>, walletId: string): Promise<bigint | null> {
  const row = await trx
    .updateTable('wallets')
    .set((eb) => ({ balance: eb('balance', '+', 0n) }))
    .where('id', '=', walletId)
    .returning(['balance'])
    .executeTakeFirst();
  if (!row) return null;
  const room = MAX_WALLET_BALANCE_UNITS - BigInt(row.balance);
  return room > 0n ? room : 0n;
}

/**
 * The operator adds money to one bucket of a wallet (`tollgate admin credit-wallet`): prepaid by
 * default; subscription cycles and bundle purchases credit `cycle` and `bundle` through here.
 */
export async function creditWallet(storage: Storage, walletId: string, units: bigint, at: string, bucket: Bucket = 'prepaid'): Promise<bigint | null> {
  if (units <= 0n) throw new RangeError('a credit must be positive');
  return storage.db.transaction().execute(async (trx) => {
    const wallet = await trx.selectFrom('wallets').select(['merchant_id']).where('id', '=', walletId).executeTakeFirst();
    if (!wallet) return null;
    const balance = await applyCredit(trx, walletId, units, bucket);
    await appendTransaction(trx, {
      kind: 'operator_credit',
      merchantId: wallet.merchant_id,
      description: bucket === 'prepaid' ? 'Operator credit' : `Operator credit (${bucket})`,
      legs: [
        { account: walletAccount(walletId, bucket), amount: units },
        { account: operatorFundingAccount(), amount: -units },
      ],
      at,
    });
    await recordBalanceEvent(trx, walletId, at);
    return balance;
  });
}

/** A merchant grants credit to its own customer's wallet (POST /customers/{id}/credits). */
export async function grantCredit(
  storage: Storage,
  input: { merchantId: string; walletId: string; amount: bigint; description: string | null; at: string },
): Promise<{ transactionId: string; balance: bigint; at: string }> {
  if (input.amount <= 0n) throw new RangeError('a credit must be positive');
  return storage.db.transaction().execute(async (trx) => {
    const balance = await applyCredit(trx, input.walletId, input.amount);
    if (balance === null) throw new RangeError(`no wallet ${input.walletId}`);
    const at = input.at;
    const transactionId = await appendTransaction(trx, {
      kind: 'credit_grant',
      merchantId: input.merchantId,
      description: input.description ?? 'Credit grant',
      legs: [
        { account: walletAccount(input.walletId, 'prepaid'), amount: input.amount },
        { account: creditGrantsAccount(input.merchantId), amount: -input.amount },
      ],
      at,
    });
    await recordBalanceEvent(trx, input.walletId, at);
    return { transactionId, balance, at };
  });
}
