import { createHmac, timingSafeEqual } from 'node:crypto';
import type { CheckoutSessionRow } from '../storage/checkout-sessions.ts';
import type { PaymentRow } from '../storage/subscriptions.ts';
import { findPayment } from '../storage/subscriptions.ts';
import type { PurchaseDeps } from './subscriptions.ts';
import { purchaseOf } from './checkout.ts';

/**
 * A completed checkout's receipt lives at a stable link the merchant can email. Its key is an
 * HMAC of the session id keyed by the hash of the session's secret, which never leaves the
 * database: nobody can derive it from anything shown, and it needs no column of its own.
 */
export function receiptKey(session: Pick<CheckoutSessionRow, 'id' | 'token_hash'>): string {
  return createHmac('sha256', session.token_hash).update(`receipt:${session.id}`).digest('base64url');
}

/** The receipt's path (`key` is a query parameter, so logged URLs mask it). */
export function receiptPath(session: Pick<CheckoutSessionRow, 'id' | 'token_hash'>): string {
  return `checkout/receipt?session=${encodeURIComponent(session.id)}&key=${receiptKey(session)}`;
}

export function receiptKeyMatches(session: Pick<CheckoutSessionRow, 'id' | 'token_hash'>, key: string): boolean {
  const expected = Buffer.from(receiptKey(session));
  const given = Buffer.from(key);
  return given.length === expected.length && timingSafeEqual(given, expected);
}

/** What a receipt and the success page recap. */
export type Receipt = {
  /** What was bought, for people ("Pro subscription", "Ten credit bundle", "Wallet top-up"). */
  item: string;
  paid: bigint;
  credited: bigint;
  /** Where the credit went: prepaid balance, bundle credit, or the plan's credit for its first cycle. */
  creditedAs: string;
  completedAt: string;
  paymentId: string;
};

/** The receipt of a completed session, or null when it did not complete with a payment. */
export async function receiptOf(deps: PurchaseDeps, session: CheckoutSessionRow): Promise<Receipt | null> {
  if (!session.completed_at) return null;
  const payment: PaymentRow | undefined = await findPayment(deps.storage.db, 'checkout', session.id);
  if (!payment || payment.status !== 'succeeded') return null;
  const purchase = await purchaseOf(deps, session);
  const base = { paid: payment.amount, completedAt: session.completed_at, paymentId: payment.id };
  if (purchase.kind === 'bundle') {
    return { ...base, item: `${purchase.bundle.name} credit bundle`, credited: BigInt(purchase.bundle.credit_amount), creditedAs: 'bundle credit' };
  }
  if (purchase.kind === 'plan') {
    const plan = purchase.plan;
    // Paid while the customer subscribed elsewhere: the payment went to the prepaid balance.
    if (session.subscription_id === null) return { ...base, item: `${plan.name} subscription`, credited: payment.amount, creditedAs: 'prepaid balance' };
    if (payment.amount === 0n && (await subscribedBefore(deps, session))) {
      // A plan change at the cycle's end (decision 0037): nothing paid or credited now.
      return { ...base, item: `Change to ${plan.name} at the end of the current cycle`, credited: 0n, creditedAs: 'now; the new plan is charged and credited when it starts' };
    }
    return { ...base, item: `${plan.name} subscription, first ${plan.billing_interval}`, credited: BigInt(plan.included_credit), creditedAs: `credit for this ${plan.billing_interval}` };
  }
  return { ...base, item: session.mode === 'onboarding' ? 'Wallet set-up' : 'Wallet top-up', credited: payment.amount, creditedAs: 'prepaid balance' };
}

/** Whether the session's subscription existed before the session: the session changed its plan. */
async function subscribedBefore(deps: PurchaseDeps, session: CheckoutSessionRow): Promise<boolean> {
  const sub = await deps.storage.db.selectFrom('subscriptions').select('started_at').where('id', '=', session.subscription_id!).executeTakeFirst();
  return sub !== undefined && sub.started_at < session.created_at;
}
