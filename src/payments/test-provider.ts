import { randomUUID } from 'node:crypto';
import type { ChargeInput, ChargeOutcome, CheckoutDetails, CheckoutField, PaymentProvider, ProviderPaymentState, RefundInput, RefundOutcome, SavedMethod } from './types.ts';

/**
 * The built-in `test` provider, the default: no money moves. Documented card numbers decide the
 * outcome (docs/decisions/0016-commerce.md); any other number is declined.
 */
export const TEST_CARDS = {
  succeeds: '4242424242424242',
  declined: '4000000000000002',
  requiresAction: '4000002500003155',
  /** Pays at checkout, but every later charge of the saved card is declined. */
  declinesLater: '4000000000000341',
} as const;

type CardBehaviour = 'succeeds' | 'declined' | 'requires_action' | 'declines_later';

const BEHAVIOUR: Record<string, CardBehaviour> = {
  [TEST_CARDS.succeeds]: 'succeeds',
  [TEST_CARDS.declined]: 'declined',
  [TEST_CARDS.requiresAction]: 'requires_action',
  [TEST_CARDS.declinesLater]: 'declines_later',
};

const ACTION_PREFIX = 'pi_test_action_';

export type TestCharge = { amount: bigint; idempotencyKey: string; providerRef: string; status: ChargeOutcome['status'] };
export type TestRefund = { amount: bigint; idempotencyKey: string; paymentRef: string; providerRef: string };

/**
 * Where a test can make the provider fail once: before a charge or refund reaches it (nothing
 * happens), or after it was made (the money moved, the caller never learns it: a timeout or a
 * crash, depending on the error given).
 */
export type TestFaultPoint = 'before_charge' | 'after_charge' | 'before_refund' | 'after_refund';

export class TestPaymentProvider implements PaymentProvider {
  readonly id = 'test';
  readonly checkoutFields: readonly CheckoutField[] = [
    { name: 'card_number', label: 'Card number', autocomplete: 'cc-number', inputmode: 'numeric', pattern: '[0-9 ]{12,23}', hint: `Test mode: ${TEST_CARDS.succeeds} pays.` },
  ];
  /** Every charge this instance made (tests count them); a repeated idempotency key answers its first outcome. */
  readonly charges: TestCharge[] = [];
  /** Every refund this instance made; a repeated idempotency key answers its first outcome. */
  readonly refunds: TestRefund[] = [];
  readonly #byKey = new Map<string, { outcome: ChargeOutcome; saved: SavedMethod | null }>();
  readonly #refundsByKey = new Map<string, RefundOutcome>();
  readonly #faults = new Map<TestFaultPoint, Error>();

  /** The next call that passes `point` throws `error` (once). */
  failOnce(point: TestFaultPoint, error: Error): void {
    this.#faults.set(point, error);
  }

  clearFaults(): void {
    this.#faults.clear();
  }

  #fault(point: TestFaultPoint): void {
    const error = this.#faults.get(point);
    if (!error) return;
    this.#faults.delete(point);
    throw error;
  }

  /** What was taken (succeeded charges) less what was given back, in money units. */
  netTaken(): { taken: bigint; refunded: bigint } {
    const taken = this.charges.filter((c) => c.status === 'succeeded').reduce((sum, c) => sum + c.amount, 0n);
    return { taken, refunded: this.refunds.reduce((sum, r) => sum + r.amount, 0n) };
  }

  async chargeAtCheckout(input: ChargeInput & { details: CheckoutDetails }): Promise<{ outcome: ChargeOutcome; saved: SavedMethod | null }> {
    const card = (input.details.card_number ?? '').replace(/[\s-]/g, '');
    const behaviour = BEHAVIOUR[card];
    if (!behaviour) return { outcome: { status: 'failed', providerRef: null, reason: 'This is not one of the test card numbers.' }, saved: null };
    if (behaviour === 'declined') return { outcome: this.#record(input, 'failed'), saved: null };
    const saved: SavedMethod = { providerRef: `pm_test_${card.slice(-4)}`, customerRef: null, label: `Test card ending ${card.slice(-4)}` };
    if (input.amount === 0n) return { outcome: { status: 'succeeded', providerRef: 'pi_test_none' }, saved };
    return { outcome: this.#record(input, behaviour === 'requires_action' ? 'requires_action' : 'succeeded', saved), saved };
  }

  async confirm(providerRef: string): Promise<ChargeOutcome> {
    if (!providerRef.startsWith(ACTION_PREFIX)) return { status: 'failed', providerRef, reason: 'No payment awaits confirmation.' };
    const charge = this.charges.find((c) => c.providerRef === providerRef);
    const outcome: ChargeOutcome = { status: 'succeeded', providerRef };
    if (charge && charge.status !== 'succeeded') {
      charge.status = 'succeeded';
      this.#byKey.set(charge.idempotencyKey, { outcome, saved: this.#byKey.get(charge.idempotencyKey)?.saved ?? null });
    }
    return outcome;
  }

  async lookupPayment(idempotencyKey: string): Promise<ProviderPaymentState | null> {
    const made = this.#byKey.get(idempotencyKey);
    return made ? { paymentId: idempotencyKey, outcome: made.outcome, saved: made.outcome.status === 'succeeded' ? made.saved : null } : null;
  }

  async refund(input: RefundInput): Promise<RefundOutcome> {
    this.#fault('before_refund');
    const earlier = this.#refundsByKey.get(input.idempotencyKey);
    if (earlier) return earlier;
    const charge = this.charges.find((c) => c.providerRef === input.paymentRef && c.status === 'succeeded');
    const given = this.refunds.filter((r) => r.paymentRef === input.paymentRef).reduce((sum, r) => sum + r.amount, 0n);
    let outcome: RefundOutcome;
    if (!charge || input.amount <= 0n || given + input.amount > charge.amount) {
      outcome = { status: 'failed', providerRef: null, reason: charge ? 'The refund is more than is left of the payment.' : 'No such succeeded payment.' };
    } else {
      outcome = { status: 'succeeded', providerRef: `re_test_${randomUUID().replace(/-/g, '')}` };
      this.refunds.push({ amount: input.amount, idempotencyKey: input.idempotencyKey, paymentRef: input.paymentRef, providerRef: outcome.providerRef });
    }
    this.#refundsByKey.set(input.idempotencyKey, outcome);
    this.#fault('after_refund');
    return outcome;
  }

  async chargeSaved(input: ChargeInput & { method: SavedMethod }): Promise<ChargeOutcome> {
    const last4 = input.method.providerRef.replace(/^pm_test_/, '');
    const card = Object.keys(BEHAVIOUR).find((c) => c.endsWith(last4));
    // Off-session there is nobody to complete an extra step: such a card is declined.
    const succeeds = card !== undefined && BEHAVIOUR[card] === 'succeeds';
    return this.#record(input, succeeds ? 'succeeded' : 'failed');
  }

  #record(input: ChargeInput, status: ChargeOutcome['status'], saved: SavedMethod | null = null): ChargeOutcome {
    this.#fault('before_charge');
    const earlier = this.#byKey.get(input.idempotencyKey);
    if (earlier) return earlier.outcome;
    const providerRef = `${status === 'requires_action' ? ACTION_PREFIX : 'pi_test_'}${randomUUID().replace(/-/g, '')}`;
    const outcome: ChargeOutcome =
      status === 'failed' ? { status, providerRef, reason: 'Your card was declined.' } : { status, providerRef };
    this.#byKey.set(input.idempotencyKey, { outcome, saved });
    this.charges.push({ amount: input.amount, idempotencyKey: input.idempotencyKey, providerRef, status });
    this.#fault('after_charge');
    return outcome;
  }
}
