import type { Transaction } from 'kysely';
import { dateOf } from '../domain/clock.ts';
import { formatMoney, MAX_WALLET_BALANCE_UNITS } from '../domain/money.ts';
import { fundWallet } from '../ledger/funding.ts';
import { ProviderUnavailableError, UNANSWERED, type ChargeOutcome, type CheckoutDetails, type SavedMethod } from '../payments/types.ts';
import { completeCheckoutSession, keepCheckoutContact, keptContactOf, type CheckoutSessionRow } from '../storage/checkout-sessions.ts';
import { insertConnectionIn, type ConnectionFields, type CustomerEventData } from '../storage/connections.ts';
import { findPlanIncludingDeleted, type CreditBundleRow, type PlanRow } from '../storage/plans.ts';
import type { Database } from '../storage/schema.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { findPayment, insertPayment, insertPaymentMethod, transitionPayment, type PaymentRow } from '../storage/subscriptions.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';
import { changePlanAtCheckout, planCheckoutTerms, type PlanCheckoutTerms } from './plan-changes.ts';
import { receiptPath } from './receipts.ts';
import { insertPaidSubscription, type PurchaseDeps } from './subscriptions.ts';

/** How long a checkout session can be paid after its creation. */
export const CHECKOUT_SESSION_TTL_MS = 60 * 60_000;

/**
 * A checkout session as the API shows it (the token only in the creation response). Given this
 * Tollgate's public base URL, a completed session carries its receipt's link (`receipt_url`).
 */
export function presentCheckoutSession(row: CheckoutSessionRow, token: string | null = null, base?: string) {
  return {
    checkout_session_id: row.id,
    checkout_session_token: token,
    checkout_mode: row.mode,
    origin_url: row.origin_url,
    reference_id: row.reference_id,
    customer_id: row.connection_id,
    connection_id: row.connection_id,
    plan_id: row.plan_id,
    subscription_config_id: row.plan_id,
    credit_bundle_id: row.credit_bundle_id,
    subscription_id: row.subscription_id,
    created_at: row.created_at,
    expires_at: row.expires_at,
    completed_at: row.completed_at,
    ...(base === undefined ? {} : { receipt_url: row.completed_at ? `${base}${receiptPath(row)}` : null }),
  };
}

/** What a session sells: a plan's period, a bundle, or an amount the customer chooses on the page. */
export type Purchase =
  | { kind: 'plan'; plan: PlanRow; price: bigint; terms: PlanCheckoutTerms }
  | { kind: 'bundle'; bundle: CreditBundleRow; price: bigint }
  | { kind: 'funds'; price: null };

export async function purchaseOf(deps: PurchaseDeps, session: CheckoutSessionRow): Promise<Purchase> {
  if (session.mode === 'subscription') {
    const plan = (await findPlanIncludingDeleted(deps.storage, session.plan_id!))!;
    // A subscriber's downgrade is paid at the renewal, not now (plan-changes.ts).
    const terms = await planCheckoutTerms(deps.storage, session.connection_id, plan);
    return { kind: 'plan', plan, price: terms.price, terms };
  }
  if (session.mode === 'credit_bundle') {
    const bundle = await deps.storage.db.selectFrom('credit_bundles').selectAll().where('id', '=', session.credit_bundle_id!).executeTakeFirstOrThrow();
    return { kind: 'bundle', bundle, price: BigInt(bundle.cost) };
  }
  return { kind: 'funds', price: null };
}

/** Whether the session can still be paid at `at`. */
export function sessionOpen(session: CheckoutSessionRow, at: Date): 'open' | 'completed' | 'expired' {
  if (session.completed_at) return 'completed';
  return session.expires_at > at.toISOString() ? 'open' : 'expired';
}

export type PayResult =
  | { status: 'completed'; session: CheckoutSessionRow }
  | { status: 'requires_action'; paymentId: string }
  /** `declined`: the provider refused the card (what card-testing limits count). */
  | { status: 'failed'; message: string; declined?: boolean }
  /** The provider did not answer: nothing is credited, the session can be paid again (503, Retry-After). */
  | { status: 'unavailable' };

export type PayInput = {
  session: CheckoutSessionRow;
  purchase: Purchase;
  /** For `funds`: the amount the customer chose. */
  amount: bigint;
  details: CheckoutDetails;
  /** A new customer's contact details (onboarding, or a subscription without a customer). */
  contact: Pick<ConnectionFields, 'first_name' | 'last_name' | 'email' | 'phone'>;
  customerEventData: CustomerEventData;
  at: Date;
};

/** The checkout's payment row, written before any provider call; null when the checkout already has one. */
export function insertCheckoutPayment(deps: PurchaseDeps, input: PayInput, stamp: string): Promise<PaymentRow | null> {
  return insertPayment(deps.storage.db, {
    merchant_id: input.session.merchant_id,
    connection_id: input.session.connection_id,
    provider: deps.payments.id,
    provider_ref: null,
    purpose: 'checkout',
    reference: input.session.id,
    amount: input.amount,
    status: 'pending',
    failure_reason: null,
    created_at: stamp,
    updated_at: stamp,
  });
}

/**
 * Pays a session through the payment provider and, once the provider confirms the payment,
 * completes it. One payment of a session is live at a time (its reference is the session id; a
 * declined one gives the reference up), so two tabs cannot pay the same session twice.
 */
export async function payCheckout(deps: PurchaseDeps, input: PayInput): Promise<PayResult> {
  const { storage, payments } = deps;
  const stamp = input.at.toISOString();
  if (await passesMaximumBalance(deps, input)) return overMaximumBalance();
  const payment = await insertCheckoutPayment(deps, input, stamp);
  if (!payment) {
    const live = await findPayment(storage.db, 'checkout', input.session.id);
    if (live?.status === 'requires_action') return { status: 'requires_action', paymentId: live.id };
    return { status: 'failed', message: 'A payment for this checkout is already in progress.' };
  }
  // The provider's webhook may complete the session instead of this request: it finds the contact there.
  if (!input.session.connection_id) await keepCheckoutContact(storage.db, input.session.id, input.contact);
  let charged: Awaited<ReturnType<typeof payments.chargeAtCheckout>>;
  try {
    charged = await payments.chargeAtCheckout({ amount: input.amount, idempotencyKey: payment.id, description: `Checkout ${input.session.id}`, details: input.details });
  } catch (e) {
    if (!(e instanceof ProviderUnavailableError)) throw e;
    // Should the provider have taken it after all, its event settles the row (processProviderEvent), once.
    await failCheckoutPayment(deps, payment, input.session.id, ['pending'], { failure_reason: UNANSWERED }, stamp);
    return { status: 'unavailable' };
  }
  return settle(deps, input, payment, charged.outcome, charged.saved);
}

/** The refusal of a purchase that would take the wallet above its maximum balance, before any charge. */
export const overMaximumBalance = (): PayResult => ({
  status: 'failed',
  message: `This purchase would take the balance above the most a wallet may hold (${displayAmount(MAX_WALLET_BALANCE_UNITS)}); nothing was charged.`,
});

/**
 * Whether crediting the purchase would take the customer's wallet above the maximum balance. Asked
 * before the customer pays: a payment the provider confirmed is credited in full (fundWallet).
 * A plan adds nothing to the prepaid balance at checkout; its cycle credit is capped instead.
 */
export async function passesMaximumBalance(deps: PurchaseDeps, input: PayInput): Promise<boolean> {
  if (!input.session.connection_id || input.purchase.kind === 'plan') return false;
  const credit = input.purchase.kind === 'bundle' ? BigInt(input.purchase.bundle.credit_amount) : input.amount;
  const wallet = await deps.storage.db
    .selectFrom('connections')
    .innerJoin('wallets', 'wallets.id', 'connections.wallet_id')
    .select('wallets.balance')
    .where('connections.id', '=', input.session.connection_id)
    .executeTakeFirst();
  return wallet !== undefined && BigInt(wallet.balance) + credit > MAX_WALLET_BALANCE_UNITS;
}

/**
 * A session's payment the provider declined or did not answer (`provider_unavailable`) is
 * recorded failed and gives up the session's reference, so nothing blocks another attempt and
 * nothing is credited.
 */
export async function failCheckoutPayment(
  deps: PurchaseDeps,
  payment: PaymentRow,
  sessionId: string,
  from: PaymentRow['status'][],
  failure: { provider_ref?: string | null; failure_reason: string },
  stamp: string,
): Promise<void> {
  await transitionPayment(deps.storage.db, payment.id, from, { status: 'failed', ...failure, reference: `${sessionId}:${payment.id}`, updated_at: stamp });
}

/** The customer completed the provider's extra step for a payment that required it. */
export async function confirmCheckout(deps: PurchaseDeps, input: PayInput, paymentId: string): Promise<PayResult> {
  const payment = await findPayment(deps.storage.db, 'checkout', input.session.id);
  if (!payment || payment.id !== paymentId || payment.status !== 'requires_action' || !payment.provider_ref) {
    return { status: 'failed', message: 'No payment of this checkout awaits confirmation.' };
  }
  let outcome: ChargeOutcome;
  try {
    outcome = await deps.payments.confirm(payment.provider_ref);
  } catch (e) {
    // Still awaiting confirmation: the customer may confirm again once the provider answers.
    if (e instanceof ProviderUnavailableError) return { status: 'unavailable' };
    throw e;
  }
  return settle(deps, input, payment, outcome, deps.commerceState.savedAwaitingConfirmation.get(payment.id) ?? null);
}

/**
 * A checkout payment the provider settled outside the page (its webhook: the customer completed an
 * extra step with the provider and never came back, or the page's request died). The session and
 * what it sells are read again; a customer it creates gets the contact details the page kept on
 * the session when it was paid. Only a payment still `pending` or `requires_action` is settled, once.
 */
export async function settleCheckoutFromProvider(
  deps: PurchaseDeps,
  payment: PaymentRow,
  outcome: ChargeOutcome,
  saved: SavedMethod | null,
  customerEventData: CustomerEventData,
): Promise<PayResult | 'not_open'> {
  if (payment.purpose !== 'checkout' || !['pending', 'requires_action'].includes(payment.status)) return 'not_open';
  // A payment that gave the session's reference up (declined, or unanswered) names it before a colon.
  const sessionId = payment.reference.split(':')[0]!;
  const session = await deps.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', sessionId).executeTakeFirst();
  if (!session) return 'not_open';
  const input: PayInput = {
    session,
    purchase: await purchaseOf(deps, session),
    amount: payment.amount,
    details: {},
    contact: keptContactOf(session),
    customerEventData,
    at: dateOf(deps.clock),
  };
  return settle(deps, input, payment, outcome, saved ?? deps.commerceState.savedAwaitingConfirmation.get(payment.id) ?? null);
}

async function settle(deps: PurchaseDeps, input: PayInput, payment: PaymentRow, outcome: ChargeOutcome, saved: SavedMethod | null): Promise<PayResult> {
  const { storage } = deps;
  const stamp = input.at.toISOString();
  if (outcome.status === 'requires_action') {
    await transitionPayment(storage.db, payment.id, ['pending'], { status: 'requires_action', provider_ref: outcome.providerRef, updated_at: stamp });
    if (saved) deps.commerceState.savedAwaitingConfirmation.set(payment.id, saved);
    return { status: 'requires_action', paymentId: payment.id };
  }
  deps.commerceState.savedAwaitingConfirmation.delete(payment.id);
  if (outcome.status === 'failed') {
    const failure = { provider_ref: outcome.providerRef, failure_reason: outcome.reason };
    await failCheckoutPayment(deps, payment, input.session.id, ['pending', 'requires_action'], failure, stamp);
    return { status: 'failed', message: outcome.reason, declined: true };
  }
  const succeeded = { status: 'succeeded' as const, provider_ref: outcome.providerRef, updated_at: stamp };
  let completed: CheckoutSessionRow | null;
  const completeOnce = () =>
    storage.db.transaction().execute(async (trx) => {
      if (!(await transitionPayment(trx, payment.id, ['pending', 'requires_action'], succeeded))) return null;
      deps.faultAt?.('credit');
      return complete(deps, trx, input, payment, saved);
    });
  try {
    // A customer created with the session's reference_id while this transaction ran makes its
    // insert fail; nothing was written, and the second run finds that customer (customerForReference).
    completed = await completeOnce().catch((e: unknown) => {
      if (isUniqueViolation(e)) return completeOnce();
      throw e;
    });
  } catch (e) {
    if (!(e instanceof CheckoutClosedError)) throw e;
    // Paid, but the session closed meanwhile: recorded for a refund, never credited.
    await transitionPayment(storage.db, payment.id, ['pending', 'requires_action'], { ...succeeded, failure_reason: 'session_closed' });
    return { status: 'failed', message: 'This checkout has already been completed or has expired; the payment will be refunded.' };
  }
  if (!completed) return { status: 'failed', message: 'This checkout was already completed.' };
  return { status: 'completed', session: completed };
}

/**
 * The customer a checkout without one creates; but when a customer took the session's reference_id
 * after the session was made, the checkout is that customer's (as if the session had been made
 * then), never a failed payment.
 */
async function customerForReference(trx: Transaction<Database>, session: CheckoutSessionRow, input: PayInput): Promise<{ id: string; wallet_id: string }> {
  if (session.reference_id !== null) {
    const taken = await trx
      .selectFrom('connections')
      .select(['id', 'wallet_id'])
      .where('merchant_id', '=', session.merchant_id)
      .where('reference_id', '=', session.reference_id)
      .where('deleted_at', 'is', null)
      .executeTakeFirst();
    if (taken) return taken;
  }
  const created = await insertConnectionIn(trx, session.merchant_id, { reference_id: session.reference_id, metadata: null, ...input.contact }, input.at.toISOString());
  await enqueueEvent(trx, { merchantId: session.merchant_id, type: 'customer.created', data: input.customerEventData(created), at: created.created_at });
  return created;
}

/** The session's effects, in the transaction that records its payment as succeeded. */
async function complete(
  deps: PurchaseDeps,
  trx: Transaction<Database>,
  input: PayInput,
  payment: PaymentRow,
  saved: SavedMethod | null,
): Promise<CheckoutSessionRow | null> {
  const { session, purchase } = input;
  const at = input.at.toISOString();
  const customer = session.connection_id
    ? await trx.selectFrom('connections').select(['id', 'wallet_id']).where('id', '=', session.connection_id).executeTakeFirstOrThrow()
    : await customerForReference(trx, session, input);
  if (saved) {
    await insertPaymentMethod(trx, {
      merchant_id: session.merchant_id,
      connection_id: customer.id,
      provider: deps.payments.id,
      provider_ref: saved.providerRef,
      provider_customer_ref: saved.customerRef,
      label: saved.label,
      created_at: at,
    });
  }
  let subscriptionId: string | null = null;
  const fund = (bucket: 'prepaid' | 'bundle', amount: bigint, description: string) =>
    fundWallet(trx, { merchantId: session.merchant_id, walletId: customer.wallet_id, bucket, amount, source: 'payment', reference: payment.id, description, at });
  if (purchase.kind === 'bundle') await fund('bundle', BigInt(purchase.bundle.credit_amount), `${purchase.bundle.name}: credit bundle`);
  else if (purchase.kind === 'funds') await fund('prepaid', payment.amount, 'Checkout top-up');
  else {
    const live = await trx.selectFrom('subscriptions').selectAll().where('connection_id', '=', customer.id).where('status', '<>', 'cancelled').executeTakeFirst();
    if (!live) subscriptionId = (await insertPaidSubscription(trx, session.merchant_id, customer, purchase.plan, input.at, payment.amount > 0n ? payment.id : null)).id;
    else {
      // A subscriber changes plan (plan-changes.ts); what no change took is kept as prepaid funds.
      const changed = await changePlanAtCheckout(trx, live, customer, purchase.plan, { amount: payment.amount, paymentId: payment.id }, input.at);
      subscriptionId = changed.subscriptionId;
      if (changed.leftOver > 0n) await fund('prepaid', changed.leftOver, `${purchase.plan.name}: paid while already subscribed`);
    }
  }
  const changes = { completed_at: at, connection_id: customer.id, subscription_id: subscriptionId };
  if (!(await completeCheckoutSession(trx, session.id, changes))) throw new CheckoutClosedError();
  const done = { ...session, ...changes };
  await enqueueEvent(trx, { merchantId: session.merchant_id, type: 'checkout.completed', data: presentCheckoutSession(done), at });
  return done;
}

/** The session completed or expired while its payment ran; nothing of it is written. */
class CheckoutClosedError extends Error {
  constructor() {
    super('The checkout session was completed or expired while its payment ran.');
  }
}

/** An amount for people: at least two decimals, no trailing zeros beyond them ("25.00", "0.125"). */
export function displayAmount(units: bigint): string {
  return formatMoney(units).replace(/(\.\d\d\d*?)0+$/, '$1');
}
