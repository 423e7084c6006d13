import type { Transaction } from 'kysely';
import { formatMoney } from '../domain/money.ts';
import type { Database, WalletsTable } from '../storage/schema.ts';
import { enqueueEvent, type NewEvent } from '../webhooks/outbox.ts';
import type { PricedRequest } from '../domain/pricing.ts';

type WalletState = Pick<WalletsTable, 'id' | 'merchant_id' | 'owner_type' | 'balance' | 'held'>;

/** Every balance change emits a balance-updated event for the wallet's owner, in the same transaction. */
export async function recordBalanceEvent(trx: Transaction<Database>, walletId: string, at: string): Promise<void> {
  const wallet = await trx
    .selectFrom('wallets')
    .leftJoin('connections', 'connections.wallet_id', 'wallets.id')
    .select(['wallets.id', 'wallets.merchant_id', 'wallets.owner_type', 'wallets.balance', 'wallets.held', 'connections.id as connection_id'])
    .where('wallets.id', '=', walletId)
    .executeTakeFirstOrThrow();
  await recordWalletBalanceEvent(trx, wallet, wallet.connection_id, at);
}

/** The same, for a wallet whose state the caller already holds (no extra read). */
async function recordWalletBalanceEvent(
  trx: Transaction<Database>,
  wallet: WalletState,
  connectionId: string | null,
  at: string,
): Promise<void> {
  await enqueueEvent(trx, walletBalanceEvent(wallet, connectionId, at));
}

/** The balance-updated event of a wallet in the state given: its customer's, or its merchant's. */
function walletBalanceEvent(wallet: WalletState, connectionId: string | null, at: string): NewEvent {
  const balance = formatMoney(BigInt(wallet.balance));
  const held = formatMoney(BigInt(wallet.held));
  // Written member by member: every charge makes one or two of these, and V8 builds a spread with
  // further members slowly (decision 0008).
  if (wallet.owner_type === 'connection' && connectionId) {
    return {
      merchantId: wallet.merchant_id,
      type: 'customer.wallet.balance.updated',
      data: { customer_id: connectionId, connection_id: connectionId, wallet_id: wallet.id, balance, held },
      at,
    };
  }
  return { merchantId: wallet.merchant_id, type: 'merchant.wallet.balance.updated', data: { wallet_id: wallet.id, balance, held }, at };
}

/**
 * The one balance-event rule, for every way of charging (a single charge, a POST /requests batch,
 * a batch of settlements): a database transaction emits one balance-updated event per wallet it
 * changed, with the balance and holds the transaction left it. What a webhook receiver acts on is
 * the latest balance, and a busy wallet's batch holds hundreds of requests (decision 0008).
 */
export class BalanceChanges {
  /** Each wallet changed, with its customer (null for a merchant's wallet). */
  readonly #wallets = new Map<WalletState, string | null>();

  /**
   * The wallets a charge changed: those it debited, and those whose holds it released (a
   * settlement's, even when it costs them nothing).
   */
  noteCharge(
    charge: { connection: { id: string } | null },
    priced: PricedRequest,
    customerWallet: WalletState,
    merchantWallet: WalletState | undefined,
    releasedHolds: boolean,
  ): void {
    if (releasedHolds || priced.totals.wallet !== 0n) this.note(customerWallet, charge.connection?.id ?? null);
    if (merchantWallet && (releasedHolds || priced.totals.merchant !== 0n)) this.note(merchantWallet, null);
  }

  /** The events, each with the wallet's state as it is now (call once the transaction's changes are made). */
  events(at: string): NewEvent[] {
    const events: NewEvent[] = [];
    for (const [wallet, connectionId] of this.#wallets) events.push(walletBalanceEvent(wallet, connectionId, at));
    return events;
  }

  /** A wallet the transaction changed. It is its customer's wherever it pays as one; the first charge naming it says which. */
  note(wallet: WalletState, connectionId: string | null): void {
    if (!this.#wallets.has(wallet)) this.#wallets.set(wallet, connectionId);
  }
}
