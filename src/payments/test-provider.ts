import { randomUUID } from 'node:crypto';
import type { ChargeInput, ChargeOutcome, CheckoutDetails, CheckoutField, PaymentProvider, SavedMethod } from './types.ts';

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

export class TestPaymentProvider implements PaymentProvider {
  readonly id = 'test';
  readonly checkoutFields: readonly CheckoutField[] = [
    { name: 'card_number', label: 'Card number', autocomplete: 'cc-number', inputmode: 'numeric', pattern: '[0-9 ]{12,23}', hint: `Test mode: ${TEST_CARDS.succeeds} pays.` },
  ];
  /** Every charge this instance made (tests count them); a repeated idempotency key answers its first outcome. */
  readonly charges: TestCharge[] = [];
  readonly #byKey = new Map<string, ChargeOutcome>();

  async chargeAtCheckout(input: ChargeInput & { details: CheckoutDetails }): Promise<{ outcome: ChargeOutcome; saved: SavedMethod | null }> {
    const card = (input.details.card_number ?? '').replace(/[\s-]/g, '');
    const behaviour = BEHAVIOUR[card];
    if (!behaviour) return { outcome: { status: 'failed', providerRef: null, reason: 'This is not one of the test card numbers.' }, saved: null };
    if (behaviour === 'declined') return { outcome: this.#record(input, 'failed'), saved: null };
    const saved: SavedMethod = { providerRef: `pm_test_${card.slice(-4)}`, customerRef: null, label: `Test card ending ${card.slice(-4)}` };
    if (input.amount === 0n) return { outcome: { status: 'succeeded', providerRef: 'pi_test_none' }, saved };
    return { outcome: this.#record(input, behaviour === 'requires_action' ? 'requires_action' : 'succeeded'), saved };
  }

  async confirm(providerRef: string): Promise<ChargeOutcome> {
    if (!providerRef.startsWith(ACTION_PREFIX)) return { status: 'failed', providerRef, reason: 'No payment awaits confirmation.' };
    return { status: 'succeeded', providerRef };
  }

  async chargeSaved(input: ChargeInput & { method: SavedMethod }): Promise<ChargeOutcome> {
    const last4 = input.method.providerRef.replace(/^pm_test_/, '');
    const card = Object.keys(BEHAVIOUR).find((c) => c.endsWith(last4));
    // Off-session there is nobody to complete an extra step: such a card is declined.
    const succeeds = card !== undefined && BEHAVIOUR[card] === 'succeeds';
    return this.#record(input, succeeds ? 'succeeded' : 'failed');
  }

  #record(input: ChargeInput, status: ChargeOutcome['status']): ChargeOutcome {
    const earlier = this.#byKey.get(input.idempotencyKey);
    if (earlier) return earlier;
    const providerRef = `${status === 'requires_action' ? ACTION_PREFIX : 'pi_test_'}${randomUUID().replace(/-/g, '')}`;
    const outcome: ChargeOutcome =
      status === 'failed' ? { status, providerRef, reason: 'Your card was declined.' } : { status, providerRef };
    this.#byKey.set(input.idempotencyKey, outcome);
    this.charges.push({ amount: input.amount, idempotencyKey: input.idempotencyKey, providerRef, status });
    return outcome;
  }
}
