import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../src/domain/clock.ts';
import { renewDueSubscriptions, RETRY_DELAYS_MS } from '../../src/commerce/renewals.ts';
import { MAX_WALLET_BALANCE_UNITS, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, saveTestCard, subscribe, walletBuckets, type PlanInput } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const DAY = 86_400_000;

describe.each(databasesUnderTest())('the cycle engine on %s', (dialect) => {
  let t: TestApp;
  let meterSlug: string;
  /** The meter `spend` uses; the tests' plans link it, so its usage draws their credit (decision 0016). */
  let meterId: string;
  beforeAll(async () => {
    t = await startTestApp(dialect);
    const meter = await t.app.inject({ method: 'POST', url: '/v1/meters', headers: t.auth(), payload: { name: 'Per call', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '1' }] } });
    meterSlug = meter.json().meter_slug;
    meterId = meter.json().meter_id;
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const engine = () => ({ storage: t.storage, payments: t.payments, clock: systemClock });
  /** Runs the engine as if the clock read the given time. */
  const runAt = (at: Date) => renewDueSubscriptions(engine(), at);
  const spend = async (customerId: string, times: number) => {
    for (let i = 0; i < times; i++) {
      const res = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: t.auth(), payload: { request_id: `r-${customerId}-${i}-${Math.random()}`, customer_id: customerId, meter_slug: meterSlug } });
      expect(res.statusCode, res.body).toBe(201);
    }
  };
  async function subscribed(plan: PlanInput, card = true) {
    const p = await createPlan(t, { meter_ids: [meterId], ...plan });
    const c = await createCustomer(t);
    if (card) await saveTestCard(t.storage, t.merchant.merchantId, c.customerId);
    const res = await subscribe(t, c.customerId, p.plan_id);
    expect(res.statusCode, res.body).toBe(201);
    const sub = res.json().subscription;
    return { plan: p, ...c, sub, end: new Date(sub.cycle_end_at) };
  }
  const stored = (id: string) => t.storage.db.selectFrom('subscriptions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

  it('rollover full keeps unused cycle and bundle credit and adds the next cycle credit, charging the period once', async () => {
    const s = await subscribed({ name: 'Full', period_amount: '10', included_credit: '5', billing_interval: 'month' });
    await creditWallet(t.storage, s.walletId, parseMoney('2'), new Date().toISOString(), 'bundle');
    await spend(s.customerId, 3); // 3 of the 5 cycle credit
    const before = t.payments.charges.length;
    expect(await runAt(new Date(s.end.getTime() - 1))).not.toContainEqual(expect.objectContaining({ subscriptionId: s.sub.subscription_id }));
    expect(await runAt(s.end)).toContainEqual({ subscriptionId: s.sub.subscription_id, outcome: 'renewed' });
    expect(await runAt(new Date(s.end.getTime() + 1000))).not.toContainEqual(expect.objectContaining({ subscriptionId: s.sub.subscription_id }));
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('10'), status: 'succeeded' })]);
    expect(await walletBuckets(t.storage, s.walletId)).toMatchObject({ cycle: parseMoney('7'), bundle: parseMoney('2'), prepaid: 0n });
    const row = await stored(s.sub.subscription_id);
    expect(row.cycle_start_at).toBe(s.sub.cycle_end_at);
    expect(new Date(row.cycle_end_at).getTime()).toBeGreaterThan(s.end.getTime() + 27 * DAY);
    const renewed = await eventsOfType(t.storage, 'subscription.renewed');
    expect(renewed.filter((e) => e.data.subscription_id === s.sub.subscription_id)).toHaveLength(1);
  });

  it("a cycle's credit fills the wallet up to its maximum balance and no further", async () => {
    const s = await subscribed({ name: 'Capped', period_amount: '0', included_credit: '5', billing_interval: 'day', rollover_type: 'full' });
    // 5 of cycle credit from the first cycle, and prepaid up to 2 below the maximum.
    await creditWallet(t.storage, s.walletId, MAX_WALLET_BALANCE_UNITS - parseMoney('7'), new Date().toISOString());
    expect(await runAt(s.end)).toContainEqual({ subscriptionId: s.sub.subscription_id, outcome: 'renewed' });
    const buckets = await walletBuckets(t.storage, s.walletId);
    expect(buckets).toMatchObject({ cycle: parseMoney('7'), prepaid: MAX_WALLET_BALANCE_UNITS - parseMoney('7') });
    expect(buckets.cycle + buckets.bundle + buckets.prepaid).toBe(MAX_WALLET_BALANCE_UNITS);
  });

  it('rollover none expires unused cycle and bundle credit before granting the new cycle', async () => {
    const s = await subscribed({ name: 'None', period_amount: '0', included_credit: '5', billing_interval: 'day', rollover_type: 'none', bundle_rollover_type: 'none' });
    await creditWallet(t.storage, s.walletId, parseMoney('2'), new Date().toISOString(), 'bundle');
    await creditWallet(t.storage, s.walletId, parseMoney('1'), new Date().toISOString(), 'prepaid');
    await spend(s.customerId, 1);
    await runAt(s.end);
    expect(await walletBuckets(t.storage, s.walletId)).toMatchObject({ cycle: parseMoney('5'), bundle: 0n, prepaid: parseMoney('1') });
  });

  it('a cancellation takes effect at the cycle end: cancelled, cycle credit gone, nothing charged', async () => {
    const s = await subscribed({ name: 'Cancel me', period_amount: '4', billing_interval: 'week' });
    await t.app.inject({ method: 'DELETE', url: `/v1/subscriptions/${s.sub.subscription_id}`, headers: t.auth() });
    await runAt(new Date(s.end.getTime() - 1000));
    expect((await stored(s.sub.subscription_id)).status).toBe('active');
    const before = t.payments.charges.length;
    expect(await runAt(s.end)).toContainEqual({ subscriptionId: s.sub.subscription_id, outcome: 'cancelled' });
    expect(t.payments.charges.length).toBe(before);
    const row = await stored(s.sub.subscription_id);
    expect(row).toMatchObject({ status: 'cancelled', cancelled_at: s.sub.cycle_end_at });
    expect((await walletBuckets(t.storage, s.walletId)).cycle).toBe(0n);
    expect((await eventsOfType(t.storage, 'subscription.cancelled')).map((e) => e.data.subscription_id)).toContain(s.sub.subscription_id);
    const listed = (await t.app.inject({ method: 'GET', url: `/v1/subscriptions?status=cancelled&customer_id=${s.customerId}`, headers: t.auth() })).json();
    expect(listed.data[0]).toMatchObject({ status: 'cancelled', pending_change: null });
  });

  it("deleting a customer cancels its subscription at once: cycle credit gone, nothing renewed or charged at the cycle's end", async () => {
    const s = await subscribed({ name: 'Deleted with its customer', period_amount: '4', included_credit: '3', billing_interval: 'week' });
    await creditWallet(t.storage, s.walletId, parseMoney('2'), new Date().toISOString(), 'bundle');
    expect((await t.app.inject({ method: 'DELETE', url: `/v1/customers/${s.customerId}`, headers: t.auth() })).statusCode).toBe(200);

    const row = await stored(s.sub.subscription_id);
    expect(row.status).toBe('cancelled');
    expect(row.cancelled_at).not.toBeNull();
    expect(new Date(row.cancelled_at!).getTime()).toBeLessThan(s.end.getTime());
    expect(await walletBuckets(t.storage, s.walletId)).toMatchObject({ cycle: 0n, bundle: parseMoney('2') });
    const cancelled = (await eventsOfType(t.storage, 'subscription.cancelled')).filter((e) => e.data.subscription_id === s.sub.subscription_id);
    expect(cancelled.map((e) => e.data)).toEqual([expect.objectContaining({ status: 'cancelled', reason: 'customer_deleted' })]);

    const before = t.payments.charges.length;
    expect(await runAt(s.end)).not.toContainEqual(expect.objectContaining({ subscriptionId: s.sub.subscription_id }));
    expect(t.payments.charges.length).toBe(before);
  });

  it('a plan change applies at the next cycle: the new plan is charged and grants its credit', async () => {
    const s = await subscribed({ name: 'Big', period_amount: '30', included_credit: '30', billing_interval: 'month', rollover_type: 'none' });
    const small = await createPlan(t, { name: 'Small', period_amount: '5', included_credit: '6', billing_interval: 'week', meter_ids: [meterId] });
    await t.app.inject({ method: 'PATCH', url: `/v1/subscriptions/${s.sub.subscription_id}`, headers: t.auth(), payload: { plan_id: small.plan_id } });
    const before = t.payments.charges.length;
    await runAt(s.end);
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('5') })]);
    const row = await stored(s.sub.subscription_id);
    expect(row).toMatchObject({ plan_id: small.plan_id, pending_plan_id: null });
    expect(new Date(row.cycle_end_at).getTime() - new Date(row.cycle_start_at).getTime()).toBe(7 * DAY);
    expect(await walletBuckets(t.storage, s.walletId)).toMatchObject({ cycle: parseMoney('6') });
  });

  it('a failed renewal makes the subscription past_due with retries, then cancels it', async () => {
    const s = await subscribed({ name: 'Flaky', period_amount: '8', billing_interval: 'month' });
    await saveTestCard(t.storage, t.merchant.merchantId, s.customerId, 'declinesLater');
    let at = s.end;
    for (const delay of RETRY_DELAYS_MS) {
      expect(await runAt(at)).toContainEqual({ subscriptionId: s.sub.subscription_id, outcome: 'past_due' });
      expect(await runAt(new Date(at.getTime() + delay - 1))).not.toContainEqual(expect.objectContaining({ subscriptionId: s.sub.subscription_id }));
      at = new Date(at.getTime() + delay);
    }
    const shown = (await t.app.inject({ method: 'GET', url: `/v1/subscriptions?customer_id=${s.customerId}`, headers: t.auth() })).json().data[0];
    expect(shown.status).toBe('past_due');
    expect(await runAt(at)).toContainEqual({ subscriptionId: s.sub.subscription_id, outcome: 'cancelled' });
    expect((await stored(s.sub.subscription_id)).status).toBe('cancelled');
    const failures = (await eventsOfType(t.storage, 'subscription.payment_failed')).filter((e) => e.data.subscription_id === s.sub.subscription_id);
    expect(failures.map((e) => e.data.attempt)).toEqual([1, 2, 3, 4]);
    expect(failures.at(-1)!.data.final).toBe(true);
    expect(await walletBuckets(t.storage, s.walletId)).toMatchObject({ cycle: 0n, balance: 0n });
  });

  it('a past_due subscription whose retry succeeds renews from its old cycle end', async () => {
    const s = await subscribed({ name: 'Recovers', period_amount: '3', included_credit: '3', billing_interval: 'month' });
    await saveTestCard(t.storage, t.merchant.merchantId, s.customerId, 'declinesLater');
    await runAt(s.end);
    await saveTestCard(t.storage, t.merchant.merchantId, s.customerId, 'succeeds');
    expect(await runAt(new Date(s.end.getTime() + RETRY_DELAYS_MS[0]))).toContainEqual({ subscriptionId: s.sub.subscription_id, outcome: 'renewed' });
    const row = await stored(s.sub.subscription_id);
    expect(row).toMatchObject({ status: 'active', cycle_start_at: s.sub.cycle_end_at });
    expect(Number(row.failed_attempts)).toBe(0);
  });

  it('a round asked to stop ends after the subscription it is renewing; the others stay due and the next round renews each once', async () => {
    const subs = [];
    for (let i = 0; i < 3; i++) subs.push(await subscribed({ name: `Stopping ${i}`, period_amount: '1', included_credit: '1', billing_interval: 'day' }));
    const at = new Date(Math.max(...subs.map((s) => s.end.getTime())));
    let renewing = 0;
    const stopped = await renewDueSubscriptions(engine(), at, { stopping: () => renewing++ > 0 });
    expect(stopped).toHaveLength(1);
    const rest = await runAt(at);
    const mine = new Set(subs.map((s) => s.sub.subscription_id));
    const renewed = [...stopped, ...rest].filter((r) => mine.has(r.subscriptionId));
    expect(renewed.map((r) => r.outcome)).toEqual(['renewed', 'renewed', 'renewed']);
    expect(new Set(renewed.map((r) => r.subscriptionId)).size).toBe(3);
  });

  it('a renewal that throws is reported and the round renews the others; it is tried again once its claim lapses', async () => {
    const subs: Awaited<ReturnType<typeof subscribed>>[] = [];
    for (const name of ['Before', 'Broken', 'After']) subs.push(await subscribed({ name: `Round ${name}`, period_amount: '1', included_credit: '1', billing_interval: 'day' }));
    const broken = subs[1]!.sub.subscription_id;
    // A provider that throws something unexpected (not "unavailable") for one plan's renewal.
    const throwing = Object.create(t.payments) as typeof t.payments;
    throwing.chargeSaved = async (input) => {
      if (input.description.startsWith('Round Broken')) throw new TypeError('the payment method is gone');
      return t.payments.chargeSaved(input);
    };
    const at = new Date(Math.max(...subs.map((s) => s.end.getTime())));
    const reported: string[] = [];
    const round = await renewDueSubscriptions({ storage: t.storage, payments: throwing, clock: systemClock }, at, {
      onError: (err, subscriptionId) => reported.push(`${subscriptionId}: ${(err as Error).message}`),
    });
    const mine = (results: { subscriptionId: string; outcome: string }[]) =>
      Object.fromEntries(results.filter((r) => subs.some((s) => s.sub.subscription_id === r.subscriptionId)).map((r) => [r.subscriptionId, r.outcome]));
    expect(mine(round)).toEqual({ [subs[0]!.sub.subscription_id]: 'renewed', [broken]: 'error', [subs[2]!.sub.subscription_id]: 'renewed' });
    expect(reported).toEqual([`${broken}: the payment method is gone`]);
    // Not retried on every tick: only once its claim has lapsed (5 minutes), then renewed once.
    expect(mine(await runAt(new Date(at.getTime() + 1000)))).toEqual({});
    expect(mine(await runAt(new Date(at.getTime() + 5 * 60_000 + 1000)))).toEqual({ [broken]: 'renewed' });
    expect((await stored(broken)).status).toBe('active');
  });
});
