import type { Transaction } from 'kysely';
import type { Database } from '../storage/schema.ts';
import { customerPaymentsAccount, expiredCreditAccount, planCreditAccount, walletAccount, type Bucket } from './accounts.ts';
import { recordBalanceEvent } from './events.ts';
import { appendTransaction } from './store/common.ts';
import { applyCredit, creditRoom, lockWallets } from './wallets.ts';
import { STORAGE_MAX_UNITS } from '../domain/money.ts';
import type { Storage } from '../storage/db.ts';

/**
 * Money that enters a wallet through commerce: a payment the provider confirmed (top-up, bundle),
 * or the credit a plan grants each cycle; and credit that expires. Each is one balanced ledger
 * transaction in the caller's database transaction, with a balance event. `reference` is unique
 * per kind, so the same payment or cycle can never be credited twice.
 *
 * The maximum wallet balance is checked before a customer pays (checkout refuses a purchase that
 * would pass it), so a payment the provider confirmed is always credited in full, up to what the
 * column holds. A plan's credit is the merchant's gift: it fills the wallet up to the maximum and
 * no further. Returns the amount credited.
 */
export type Funding = {
  merchantId: string;
  walletId: string;
  bucket: Bucket;
  amount: bigint;
  /** `payment`: the customer paid it; `plan_credit`: a subscription cycle grants it. */
  source: 'payment' | 'plan_credit';
  reference: string;
  description: string;
  at: string;
};

export async function fundWallet(trx: Transaction<Database>, f: Funding): Promise<bigint> {
  const amount = f.source === 'payment' ? f.amount : await cappedPlanCredit(trx, f);
  if (amount <= 0n) return 0n;
  const balance = await applyCredit(trx, f.walletId, amount, f.bucket, f.source === 'payment' ? STORAGE_MAX_UNITS : undefined);
  if (balance === null) throw new RangeError(`no wallet ${f.walletId}`);
  await appendTransaction(trx, {
    kind: f.source === 'payment' ? 'customer_payment' : 'plan_credit',
    merchantId: f.merchantId,
    reference: f.reference,
    description: f.description,
    legs: [
      { account: walletAccount(f.walletId, f.bucket), amount },
      { account: f.source === 'payment' ? customerPaymentsAccount(f.merchantId) : planCreditAccount(f.merchantId), amount: -amount },
    ],
    at: f.at,
  });
  await recordBalanceEvent(trx, f.walletId, f.at);
  return amount;
}

async function cappedPlanCredit(trx: Transaction<Database>, f: Funding): Promise<bigint> {
  if (f.amount <= 0n) return 0n;
  const room = await creditRoom(trx, f.walletId);
  if (room === null) throw new RangeError(`no wallet ${f.walletId}`);
  return f.amount < room ? f.amount : room;
}

/**
 * Removes what is left in the cycle or bundle bucket of a wallet (rollover `none`, cancellation);
 * returns the amount that expired. Locks the wallet first.
 */
export async function expireBucket(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  input: { merchantId: string; walletId: string; bucket: 'cycle' | 'bundle'; reference: string; at: string },
): Promise<bigint> {
  const wallet = (await lockWallets(trx, dialect, [input.walletId])).get(input.walletId);
  if (!wallet) throw new RangeError(`no wallet ${input.walletId}`);
  const left = BigInt(input.bucket === 'cycle' ? wallet.cycle_credit : wallet.bundle_credit);
  if (left <= 0n) return 0n;
  await trx
    .updateTable('wallets')
    .set((eb) => ({
      balance: eb('balance', '-', left),
      ...(input.bucket === 'cycle' ? { cycle_credit: eb('cycle_credit', '-', left) } : { bundle_credit: eb('bundle_credit', '-', left) }),
    }))
    .where('id', '=', input.walletId)
    .execute();
  await appendTransaction(trx, {
    kind: `${input.bucket}_credit_expiry`,
    merchantId: input.merchantId,
    reference: input.reference,
    description: `Unused ${input.bucket} credit expired`,
    legs: [
      { account: walletAccount(input.walletId, input.bucket), amount: -left },
      { account: expiredCreditAccount(input.merchantId), amount: left },
    ],
    at: input.at,
  });
  await recordBalanceEvent(trx, input.walletId, input.at);
  return left;
}

/**
 * A refund's move of payment credit (a top-up's prepaid, a bundle's, or a plan period's cycle
 * credit): `take_back` removes credit a refunded payment gave (kind
 * `customer_refund`), `restore` puts it back when the provider refused that refund (kind
 * `customer_refund_reversed`); both reference the refund. The caller locked the wallet and decided
 * the amount from it (at most what the bucket holds), in this transaction.
 */
export async function moveRefundCredit(
  trx: Transaction<Database>,
  input: { merchantId: string; walletId: string; bucket: Bucket; amount: bigint; direction: 'take_back' | 'restore'; reference: string; at: string },
): Promise<void> {
  if (input.amount <= 0n) return;
  const delta = input.direction === 'take_back' ? -input.amount : input.amount;
  await trx
    .updateTable('wallets')
    .set((eb) => ({
      balance: eb('balance', '+', delta),
      ...(input.bucket === 'bundle' ? { bundle_credit: eb('bundle_credit', '+', delta) } : {}),
      ...(input.bucket === 'cycle' ? { cycle_credit: eb('cycle_credit', '+', delta) } : {}),
    }))
    .where('id', '=', input.walletId)
    .execute();
  await appendTransaction(trx, {
    kind: input.direction === 'take_back' ? 'customer_refund' : 'customer_refund_reversed',
    merchantId: input.merchantId,
    reference: input.reference,
    description: input.direction === 'take_back' ? 'Payment refunded' : 'Refund refused by the payment provider',
    legs: [
      { account: walletAccount(input.walletId, input.bucket), amount: delta },
      // A plan period's cycle credit was the plan's grant: it goes back to where it came from.
      { account: input.bucket === 'cycle' ? planCreditAccount(input.merchantId) : customerPaymentsAccount(input.merchantId), amount: -delta },
    ],
    at: input.at,
  });
  await recordBalanceEvent(trx, input.walletId, input.at);
}
