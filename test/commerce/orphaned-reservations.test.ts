import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ORPHANED_RESERVATION_MS, settleOrphanedReservations } from '../../src/commerce/subscriptions.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import type { ChargeInput, ChargeOutcome, SavedMethod } from '../../src/payments/types.ts';
import { TestPaymentProvider } from '../../src/payments/test-provider.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * The test provider, except that the next off-session charge never answers (`loseNext`: the
 * process that made it "dies" during the call, throwing before anything is recorded, as a crash
 * would leave it) or answers only when the test lets it (`holdNext`: the charge is in flight).
 */
class ProviderWithControlledCharges extends TestPaymentProvider {
  loseNext = false;
  private held?: { reached: () => void; released: Promise<void> };

  /** Holds the next charge until `release`; `reached` resolves once the charge has been asked for. */
  holdNextCharge(): { reached: Promise<void>; release: () => void } {
    let reached!: () => void;
    let release!: () => void;
    const asked = new Promise<void>((resolve) => (reached = resolve));
    this.held = { reached, released: new Promise<void>((resolve) => (release = resolve)) };
    return { reached: asked, release };
  }

  override async chargeSaved(input: ChargeInput & { method: SavedMethod }): Promise<ChargeOutcome> {
    if (this.loseNext) {
      this.loseNext = false;
      throw new Error('the process died during the charge');
    }
    const held = this.held;
    if (held) {
      this.held = undefined;
      held.reached();
      await held.released;
    }
    return super.chargeSaved(input);
  }
}

describe.each(databasesUnderTest())('crash-orphaned subscription reservations on %s', (dialect) => {
  let t: TestApp;
  const payments = new ProviderWithControlledCharges();
  beforeAll(async () => {
    t = await startTestApp(dialect, { payments });
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const deps = () => ({ storage: t.storage, payments, clock: t.clock });
  const statusOf = async (customerId: string) =>
    (await t.storage.db.selectFrom('subscriptions').select('status').where('connection_id', '=', customerId).execute()).map((r) => r.status);

  /** A paid subscription whose request died during its first charge: the row is left `incomplete`, its payment `pending`. */
  async function orphaned(card: 'succeeds' | 'declinesLater') {
    const plan = await createPlan(t, { name: `Pro ${card}`, period_amount: '10', included_credit: '12', billing_interval: 'month' });
    const c = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, c.customerId, card);
    payments.loseNext = true;
    expect((await subscribe(t, c.customerId, plan.plan_id)).statusCode).toBe(500);
    expect(await statusOf(c.customerId)).toEqual(['incomplete']);
    // The orphan is invisible but blocks the customer's next subscription until it is settled.
    expect((await t.app.inject({ method: 'GET', url: `/v1/customers/${c.customerId}/subscription`, headers: t.auth() })).json()).toEqual({ subscription: null });
    expect((await subscribe(t, c.customerId, plan.plan_id)).json().error.code).toBe('subscription_exists');
    return { ...c, plan };
  }

  it('an orphan whose charge the provider confirms when asked again starts, with its cycle credit; one that is declined is deleted', async () => {
    const paid = await orphaned('succeeds');
    const declined = await orphaned('declinesLater');
    // A reservation younger than the limit may still have a live request charging it.
    expect(await settleOrphanedReservations(deps(), dateOf(t.clock))).toEqual({ started: 0, deleted: 0 });

    t.clock.advance(ORPHANED_RESERVATION_MS + 1000);
    const before = payments.charges.length;
    expect(await settleOrphanedReservations(deps(), dateOf(t.clock))).toEqual({ started: 1, deleted: 1 });
    expect(payments.charges.slice(before).map((c) => c.status).sort()).toEqual(['failed', 'succeeded']);
    expect(await statusOf(paid.customerId)).toEqual(['active']);
    expect(await walletBuckets(t.storage, paid.walletId)).toMatchObject({ cycle: parseMoney('12') });
    const payment = await t.storage.db.selectFrom('payments').select(['status']).where('connection_id', '=', paid.customerId).executeTakeFirstOrThrow();
    expect(payment.status).toBe('succeeded');
    expect(await statusOf(declined.customerId)).toEqual([]);
    expect((await walletBuckets(t.storage, declined.walletId)).balance).toBe(0n);

    // Settled once: another pass (another instance) finds nothing, and the declined customer can subscribe again.
    expect(await settleOrphanedReservations(deps(), dateOf(t.clock))).toEqual({ started: 0, deleted: 0 });
    await saveTestCard(t.storage, t.merchant.merchantId, declined.customerId, 'succeeds');
    expect((await subscribe(t, declined.customerId, declined.plan.plan_id)).statusCode).toBe(201);
  });

  it('deleting a customer while its first period is being charged leaves the reservation to that charge, which, succeeding, is kept for a refund, removes it and credits nothing, without an event', async () => {
    const plan = await createPlan(t, { name: 'Pro in flight', period_amount: '10', included_credit: '12', billing_interval: 'month' });
    const c = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, c.customerId, 'succeeds');
    const held = payments.holdNextCharge();
    const subscribing = subscribe(t, c.customerId, plan.plan_id);
    await held.reached;
    expect(await statusOf(c.customerId)).toEqual(['incomplete']);

    const deleted = await t.app.inject({ method: 'DELETE', url: `/v1/customers/${c.customerId}`, headers: t.auth() });
    expect(deleted.statusCode).toBe(200);
    expect(await statusOf(c.customerId)).toEqual(['incomplete']);
    held.release();

    const answer = await subscribing;
    expect(answer.statusCode).toBe(404);
    expect(answer.json().error.code).toBe('not_found');
    const payment = await t.storage.db.selectFrom('payments').select(['status', 'failure_reason']).where('connection_id', '=', c.customerId).executeTakeFirstOrThrow();
    expect(payment).toEqual({ status: 'succeeded', failure_reason: 'cycle_closed' });
    expect(await statusOf(c.customerId)).toEqual([]);
    expect(await walletBuckets(t.storage, c.walletId)).toMatchObject({ balance: 0n, cycle: 0n });
    // The subscription never started, so it neither began nor ended for the merchant's webhooks.
    const aboutCustomer = async (type: string) => (await eventsOfType(t.storage, type)).filter((e) => e.data.customer_id === c.customerId);
    expect(await aboutCustomer('subscription.created')).toEqual([]);
    expect(await aboutCustomer('subscription.cancelled')).toEqual([]);
  });

  it('a deletion racing the start of a first period never leaves a deleted customer subscribed, and a charge that went through is either refunded or ends with its subscription', async () => {
    const plan = await createPlan(t, { name: 'Pro raced', period_amount: '10', included_credit: '12', billing_interval: 'month' });
    const RACES = 40;
    const outcomes = { refunded: 0, cancelled_with_customer: 0 };
    for (let race = 0; race < RACES; race++) {
      const c = await createCustomer(t);
      await saveTestCard(t.storage, t.merchant.merchantId, c.customerId, 'succeeds');
      const held = payments.holdNextCharge();
      const subscribing = subscribe(t, c.customerId, plan.plan_id);
      await held.reached;
      // The deletion starts up to 4 ms either side of the provider's answer, so across the races
      // it lands before, inside and after the transaction that starts the subscription.
      const offset = (race % 9) - 4;
      // Wall clock: the race is between two real moments, a few milliseconds apart.
      const deleting = new Promise((r) => setTimeout(r, Math.max(0, offset))).then(() =>
        t.app.inject({ method: 'DELETE', url: `/v1/customers/${c.customerId}`, headers: t.auth() }),
      );
      setTimeout(held.release, Math.max(0, -offset));
      const [answer, deleted] = await Promise.all([subscribing, deleting]);
      expect(deleted.statusCode).toBe(200);
      expect([201, 404]).toContain(answer.statusCode);

      const subscriptions = await t.storage.db.selectFrom('subscriptions').select(['status']).where('connection_id', '=', c.customerId).execute();
      expect(subscriptions.filter((sub) => sub.status !== 'cancelled'), `race ${race}: a deleted customer is still subscribed`).toEqual([]);
      const payment = await t.storage.db.selectFrom('payments').select(['status', 'failure_reason']).where('connection_id', '=', c.customerId).executeTakeFirstOrThrow();
      expect(payment.status).toBe('succeeded');
      if (subscriptions.length === 0) {
        expect(payment.failure_reason, `race ${race}: a charge with no subscription is kept for a refund`).toBe('cycle_closed');
        outcomes.refunded++;
      } else {
        expect(answer.statusCode).toBe(201);
        outcomes.cancelled_with_customer++;
      }
    }
    // Both orders happened: the deletion came first in some races and after the start in others.
    expect(outcomes.refunded, 'deletion first').toBeGreaterThan(0);
    expect(outcomes.cancelled_with_customer, 'start first').toBeGreaterThan(0);
  });

  it('a customer deleted after its first charge was lost: the orphan settler asks again, keeps the succeeded payment for a refund and credits nothing', async () => {
    const { customerId, walletId } = await orphaned('succeeds');
    const deleted = await t.app.inject({ method: 'DELETE', url: `/v1/customers/${customerId}`, headers: t.auth() });
    expect(deleted.statusCode).toBe(200);
    // The charge's outcome is still unknown: the reservation stays, so the payment is not lost track of.
    expect(await statusOf(customerId)).toEqual(['incomplete']);

    t.clock.advance(ORPHANED_RESERVATION_MS + 1000);
    const before = payments.charges.length;
    expect(await settleOrphanedReservations(deps(), dateOf(t.clock))).toEqual({ started: 0, deleted: 1 });
    expect(payments.charges.slice(before).map((c) => c.status)).toEqual(['succeeded']);
    const payment = await t.storage.db.selectFrom('payments').select(['status', 'failure_reason']).where('connection_id', '=', customerId).executeTakeFirstOrThrow();
    expect(payment).toEqual({ status: 'succeeded', failure_reason: 'cycle_closed' });
    expect(await statusOf(customerId)).toEqual([]);
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ balance: 0n, cycle: 0n });
    const aboutCustomer = async (type: string) => (await eventsOfType(t.storage, type)).filter((e) => e.data.customer_id === customerId);
    expect(await aboutCustomer('subscription.created')).toEqual([]);
    expect(await aboutCustomer('subscription.cancelled')).toEqual([]);
  });

  it('an orphan left before its payment was recorded is deleted without any charge', async () => {
    const plan = await createPlan(t, { name: 'Reserved only', period_amount: '3', billing_interval: 'week' });
    const c = await createCustomer(t);
    const at = new Date(t.clock.now() - ORPHANED_RESERVATION_MS - 60_000).toISOString();
    await t.storage.db
      .insertInto('subscriptions')
      .values({
        id: 'sub_orphan_without_payment',
        merchant_id: t.merchant.merchantId,
        connection_id: c.customerId,
        plan_id: plan.plan_id,
        status: 'incomplete',
        auto_top_up_bundle_id: null,
        started_at: at,
        cancelled_at: null,
        cycle_start_at: at,
        cycle_end_at: at,
        cycle_anchor_at: at,
        pending_plan_id: null,
        cancel_at_cycle_end: 0,
        claimed_until: null,
        failed_attempts: 0,
        next_attempt_at: null,
        created_at: at,
      })
      .execute();
    const before = payments.charges.length;
    expect(await settleOrphanedReservations(deps(), dateOf(t.clock))).toEqual({ started: 0, deleted: 1 });
    expect(payments.charges.length).toBe(before);
    expect(await statusOf(c.customerId)).toEqual([]);
  });
});
