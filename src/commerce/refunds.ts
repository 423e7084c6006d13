import type { Transaction } from 'kysely';
import { dateOf } from '../domain/clock.ts';
import { newId } from '../domain/ids.ts';
import { formatMoney } from '../domain/money.ts';
import { creditFor, maxRefund, type RefundBasis } from '../domain/refund-math.ts';
import { parseWalletAccount } from '../ledger/accounts.ts';
import { moveRefundCredit } from '../ledger/funding.ts';
import { lockWallets } from '../ledger/wallets.ts';
import { ProviderUnavailableError, type RefundOutcome } from '../payments/types.ts';
import { findMerchantPayment, insertRefund, refundedAmounts, refundsOf, settleRefundRow, type RefundRow } from '../storage/payments.ts';
import type { Database } from '../storage/schema.ts';
import type { PaymentRow } from '../storage/subscriptions.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';
import { endRefundedPeriod } from './renewals.ts';
import type { CommerceDeps } from './subscriptions.ts';

/**
 * Refunds of payments (decision 0038). A refund is written before the provider is asked, in the
 * transaction that takes its credit back out of the wallet, so the credit cannot be spent while
 * the money goes back; its row's id is the provider's idempotency key. The provider's answer then
 * settles it once (compare-and-set on `pending`): accepted → `succeeded` and `payment.refunded`;
 * refused → `failed` and the credit put back. No answer leaves it pending for the reconciliation
 * to ask again with the same key.
 */

/** Payments recorded succeeded but never credited (paid after their session or cycle closed). */
export const UNCREDITED_REASONS = ['session_closed', 'cycle_closed'] as const;

export type RefundRequest = { merchantId: string; paymentId: string; amount?: bigint; reason?: string | null };

export type RefundResult =
  | { ok: true; refund: RefundRow; payment: PaymentRow }
  | { ok: false; reason: 'not_found' | 'not_refundable' | 'exceeds_refundable'; message: string };

/**
 * The credit a payment put into a wallet: the wallet leg of its `customer_payment` ledger
 * transaction (a top-up, a bundle), or of the `plan_credit` grant it paid for (a plan period,
 * linked by its `credit_reference`: that cycle credit).
 */
type PaymentCredit = { walletId: string; bucket: RefundBucket; amount: bigint } | null;
type RefundBucket = NonNullable<RefundRow['bucket']>;

/** What a payment credited, and for a plan period's payment the subscription it paid; 'unlinked': a plan period paid before payments named their credit. */
type CreditOfPayment = { credit: PaymentCredit; subscriptionId: string | null } | 'unlinked';

async function creditOfPayment(trx: Transaction<Database>, payment: PaymentRow): Promise<CreditOfPayment> {
  const own = await walletLegOf(trx, payment.merchant_id, 'customer_payment', payment.id);
  if (own && own.bucket !== 'cycle') return { credit: own, subscriptionId: null };
  if (payment.failure_reason !== null && (UNCREDITED_REASONS as readonly string[]).includes(payment.failure_reason)) return { credit: null, subscriptionId: null };
  if (payment.credit_reference === null) return 'unlinked';
  // A plan whose credit is zero (or a wallet at its maximum) granted nothing: nothing to take back.
  const granted = await walletLegOf(trx, payment.merchant_id, 'plan_credit', payment.credit_reference);
  return { credit: granted, subscriptionId: subscriptionOfCredit(payment.credit_reference) };
}

/** A plan credit's reference starts with its subscription's id (`<subscription>:…`, subscriptions.ts grantCycleCredit). */
const subscriptionOfCredit = (reference: string) => reference.slice(0, reference.indexOf(':'));

async function walletLegOf(trx: Transaction<Database>, merchantId: string, kind: 'customer_payment' | 'plan_credit', reference: string): Promise<PaymentCredit> {
  const legs = await trx
    .selectFrom('ledger_transactions as t')
    .innerJoin('ledger_postings as p', 'p.transaction_id', 't.id')
    .select(['p.account', 'p.amount'])
    .where('t.merchant_id', '=', merchantId)
    .where('t.kind', '=', kind)
    .where('t.reference', '=', reference)
    .execute();
  for (const leg of legs) {
    const wallet = parseWalletAccount(leg.account);
    if (wallet) return { walletId: wallet.walletId, bucket: wallet.bucket, amount: BigInt(leg.amount) };
  }
  return null;
}

/** What the payment's refunds so far, and its wallet now, allow. The wallet is locked (PostgreSQL). */
async function basisOf(deps: CommerceDeps, trx: Transaction<Database>, payment: PaymentRow, credit: PaymentCredit): Promise<RefundBasis> {
  const earlier = (await refundsOf(trx, payment.id)).filter((r) => r.status !== 'failed');
  let unspent = 0n;
  if (credit) {
    const wallet = (await lockWallets(trx, deps.storage.dialect, [credit.walletId])).get(credit.walletId);
    if (wallet) {
      const balance = BigInt(wallet.balance);
      const inBucket = bucketOf(wallet, credit.bucket);
      const free = balance - BigInt(wallet.held);
      unspent = inBucket < free ? inBucket : free;
    }
  }
  return {
    paid: payment.amount,
    credited: credit?.amount ?? 0n,
    refunded: earlier.reduce((sum, r) => sum + BigInt(r.amount), 0n),
    creditTakenBack: earlier.reduce((sum, r) => sum + BigInt(r.credit_amount), 0n),
    unspent,
    step: deps.payments.refundStep ?? 1n,
  };
}

/** What a wallet's bucket holds now. */
function bucketOf(wallet: { balance: bigint | string; cycle_credit: bigint | string; bundle_credit: bigint | string }, bucket: RefundBucket): bigint {
  if (bucket === 'cycle') return BigInt(wallet.cycle_credit);
  if (bucket === 'bundle') return BigInt(wallet.bundle_credit);
  return BigInt(wallet.balance) - BigInt(wallet.cycle_credit) - BigInt(wallet.bundle_credit);
}

/**
 * Refunds `amount` of a succeeded payment (by default as much as can be): through the provider,
 * taking back the credit it gave in proportion, at most what the wallet still holds of it.
 */
export async function refundPayment(deps: CommerceDeps, request: RefundRequest): Promise<RefundResult> {
  const stamp = dateOf(deps.clock).toISOString();
  const recorded = await deps.storage.db.transaction().execute(async (trx): Promise<RefundResult> => {
    const payment = await findMerchantPayment(trx, request.merchantId, request.paymentId);
    if (!payment) return { ok: false, reason: 'not_found', message: `No payment ${request.paymentId}.` };
    if (payment.status !== 'succeeded' || !payment.provider_ref) {
      return { ok: false, reason: 'not_refundable', message: `Only a succeeded payment can be refunded; this one is ${payment.status}.` };
    }
    const credited = await creditOfPayment(trx, payment);
    if (credited === 'unlinked') {
      return { ok: false, reason: 'not_refundable', message: "This payment paid a plan's period before payments named the credit they paid for, so the credit to take back is unknown; it cannot be refunded here." };
    }
    const { credit } = credited;
    const basis = await basisOf(deps, trx, payment, credit);
    const most = maxRefund(basis);
    const amount = request.amount ?? most;
    if (amount <= 0n || amount > most) {
      const left = basis.paid - basis.refunded;
      return {
        ok: false,
        reason: 'exceeds_refundable',
        message:
          left <= 0n
            ? 'The payment is already refunded in full.'
            : `At most ${formatMoney(most)} of this payment can be refunded now: ${formatMoney(left)} is not yet refunded, and a refund takes back only credit the customer has not spent.`,
      };
    }
    const refund: RefundRow = {
      id: newId('refund'),
      merchant_id: payment.merchant_id,
      payment_id: payment.id,
      amount,
      credit_amount: credit ? creditFor(basis, amount) : 0n,
      wallet_id: credit?.walletId ?? null,
      bucket: credit?.bucket ?? null,
      provider_ref: null,
      status: 'pending',
      reason: request.reason ?? null,
      failure_reason: null,
      created_at: stamp,
      updated_at: stamp,
    };
    await insertRefund(trx, refund);
    if (credit) await moveRefundCredit(trx, { ...refundCredit(refund, credit), direction: 'take_back', at: stamp });
    return { ok: true, refund, payment };
  });
  if (!recorded.ok) return recorded;
  return { ...recorded, refund: await askProviderToRefund(deps, recorded.refund, recorded.payment) };
}

const refundCredit = (refund: RefundRow, credit: { walletId: string; bucket: RefundBucket }) => ({
  merchantId: refund.merchant_id,
  walletId: credit.walletId,
  bucket: credit.bucket,
  amount: BigInt(refund.credit_amount),
  reference: refund.id,
});

/**
 * Asks the provider for a recorded refund (again, with the same key, when the reconciliation
 * retries one) and settles it. No answer leaves it pending; the refund row is returned as it is.
 */
export async function askProviderToRefund(deps: CommerceDeps, refund: RefundRow, payment: PaymentRow): Promise<RefundRow> {
  let outcome: RefundOutcome;
  try {
    outcome = await deps.payments.refund({ paymentRef: payment.provider_ref!, amount: BigInt(refund.amount), idempotencyKey: refund.id });
  } catch (e) {
    if (e instanceof ProviderUnavailableError) return refund;
    throw e;
  }
  return settleRefund(deps, refund, payment, outcome);
}

async function settleRefund(deps: CommerceDeps, refund: RefundRow, payment: PaymentRow, outcome: RefundOutcome): Promise<RefundRow> {
  const stamp = dateOf(deps.clock).toISOString();
  const settled: RefundRow = {
    ...refund,
    status: outcome.status,
    provider_ref: outcome.providerRef,
    failure_reason: outcome.status === 'failed' ? outcome.reason : null,
    updated_at: stamp,
  };
  await deps.storage.db.transaction().execute(async (trx) => {
    if (!(await settleRefundRow(trx, refund.id, settled))) return;
    if (outcome.status === 'failed') {
      if (refund.wallet_id && refund.bucket) {
        await lockWallets(trx, deps.storage.dialect, [refund.wallet_id]);
        await moveRefundCredit(trx, { ...refundCredit(refund, { walletId: refund.wallet_id, bucket: refund.bucket }), direction: 'restore', at: stamp });
      }
      return;
    }
    const refunded = (await refundedAmounts(trx, [payment.id])).get(payment.id) ?? 0n;
    await enqueueEvent(trx, { merchantId: refund.merchant_id, type: 'payment.refunded', data: { ...presentRefund(settled), payment: presentPayment(payment, refunded) }, at: stamp });
    // A plan period's payment given back in full may end its subscription (decision 0044).
    if (payment.credit_reference !== null && (await succeededRefunds(trx, payment.id)) >= BigInt(payment.amount)) {
      await endRefundedPeriod(deps, trx, payment, subscriptionOfCredit(payment.credit_reference), stamp);
    }
  });
  return settled;
}

/** What the payment's refunds the provider accepted give back. */
async function succeededRefunds(trx: Transaction<Database>, paymentId: string): Promise<bigint> {
  return (await refundsOf(trx, paymentId)).filter((r) => r.status === 'succeeded').reduce((sum, r) => sum + BigInt(r.amount), 0n);
}

export function presentRefund(row: RefundRow) {
  return {
    refund_id: row.id,
    payment_id: row.payment_id,
    amount: formatMoney(BigInt(row.amount)),
    credit_amount: formatMoney(BigInt(row.credit_amount)),
    status: row.status,
    reason: row.reason,
    failure_reason: row.failure_reason,
    provider_ref: row.provider_ref,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

/** A payment as the API shows it; `refunded` is what its refunds that were not refused add up to. */
export function presentPayment(row: PaymentRow, refunded: bigint) {
  return {
    payment_id: row.id,
    customer_id: row.connection_id,
    purpose: row.purpose,
    amount: formatMoney(BigInt(row.amount)),
    amount_refunded: formatMoney(refunded),
    status: row.status,
    failure_reason: row.failure_reason,
    provider: row.provider,
    provider_ref: row.provider_ref,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}
