import type { Transaction } from 'kysely';
import { formatMoney } from '../domain/money.ts';
import type { Database } from '../storage/schema.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';

/** Every balance change emits a balance-updated event for the wallet's owner, in the same transaction. */
export async function recordBalanceEvent(trx: Transaction<Database>, walletId: string, at: string): Promise<void> {
  const wallet = await trx
    .selectFrom('wallets')
    .leftJoin('connections', 'connections.wallet_id', 'wallets.id')
    .select(['wallets.merchant_id', 'wallets.owner_type', 'wallets.balance', 'wallets.held', 'connections.id as connection_id'])
    .where('wallets.id', '=', walletId)
    .executeTakeFirstOrThrow();
  const balance = { wallet_id: walletId, balance: formatMoney(BigInt(wallet.balance)), held: formatMoney(BigInt(wallet.held)) };
  if (wallet.owner_type === 'connection' && wallet.connection_id) {
    await enqueueEvent(trx, {
      merchantId: wallet.merchant_id,
      type: 'customer.wallet.balance.updated',
      data: { customer_id: wallet.connection_id, connection_id: wallet.connection_id, ...balance },
      at,
    });
  } else {
    await enqueueEvent(trx, { merchantId: wallet.merchant_id, type: 'merchant.wallet.balance.updated', data: balance, at });
  }
}
