/**
 * Wallets as the operator funds them (`tollgate admin credit-wallet`): money added to one bucket
 * of any wallet, a balanced ledger transaction with its balance event. A merchant crediting its
 * own customer goes through services/customers.ts instead.
 */
import type { AppDeps } from '../app-deps.ts';
import { dateOf } from '../domain/clock.ts';
import { formatMoney } from '../domain/money.ts';
import { ApiError, notFound } from '../http/errors.ts';
import type { Bucket } from '../ledger/accounts.ts';
import { creditWallet, WalletBalanceLimitError } from '../ledger/wallets.ts';

export { BUCKET_ORDER, type Bucket } from '../ledger/accounts.ts';

/** Adds a positive amount to one bucket of a wallet; answers the new balance. */
export async function creditWalletBucket(deps: Pick<AppDeps, 'storage' | 'clock'>, walletId: string, amount: bigint, bucket: Bucket): Promise<bigint> {
  const balance = await creditWallet(deps.storage, walletId, amount, dateOf(deps.clock).toISOString(), bucket).catch((e: unknown) => {
    if (e instanceof WalletBalanceLimitError) {
      throw new ApiError('wallet_balance_limit', `The credit would take the wallet above its maximum balance, ${formatMoney(e.ceiling)}.`);
    }
    throw e;
  });
  if (balance === null) throw notFound('wallet', walletId);
  return balance;
}
