import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../src/domain/clock.ts';
import { HOLD_WAIT_MS, topUpIfShort } from '../../src/commerce/auto-top-up.ts';
import { placeHold, releaseHold } from '../../src/ledger/holds.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { until } from '../helpers/until.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { openStorage } from '../../src/storage/db.ts';
import type { PaymentProvider } from '../../src/payments/types.ts';
import { TestClock } from '../helpers/clock.ts';
import { CommerceState } from '../../src/commerce/state.ts';

describe.each(databasesUnderTest())('auto top-up on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  async function subscribedWithBundle(card: 'succeeds' | 'declinesLater') {
    const plan = await createPlan(t, { name: 'Zero credit', period_amount: '0', included_credit: '0', billing_interval: 'month', credit_bundles: [{ name: 'Refill', cost: '4', credit_amount: '5' }], default_auto_top_up_bundle_index: 0 });
    const c = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, c.customerId, card);
    expect((await subscribe(t, c.customerId, plan.plan_id)).statusCode).toBe(201);
    return c;
  }
  /** This instance's in-process state, as its app keeps it. */
  const commerceState = new CommerceState();
  const deps = () => ({ storage: t.storage, payments: t.payments, clock: systemClock, commerceState });

  it('buys the bundle once for 20 concurrent requests short of money, then covers them from it', async () => {
    const { walletId } = await subscribedWithBundle('succeeds');
    const before = t.payments.charges.length;
    const results = await Promise.all(Array.from({ length: 20 }, () => topUpIfShort(deps(), walletId, parseMoney('1'), new Date())));
    expect(results.filter((r) => r === 'bought')).toHaveLength(1);
    expect(results.every((r) => r === 'bought' || r === 'bought_by_another' || r === 'covered')).toBe(true);
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('4'), status: 'succeeded' })]);
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ bundle: parseMoney('5'), balance: parseMoney('5') });
    expect(await topUpIfShort(deps(), walletId, parseMoney('5'), new Date())).toBe('covered');
    expect(await topUpIfShort(deps(), walletId, parseMoney('6'), new Date())).toBe('bought');
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('10'));
  });

  it('callers wait for the purchase in progress on its turn (across instances on PostgreSQL), never on a clock: one charge, and no caller ends before it', async () => {
    const { walletId } = await subscribedWithBundle('succeeds');
    // The provider's charge is held until the test lets it go.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let charging!: () => void;
    const started = new Promise<void>((resolve) => (charging = resolve));
    const gated: PaymentProvider = Object.assign(Object.create(t.payments) as PaymentProvider, {
      chargeSaved: async (input: Parameters<PaymentProvider['chargeSaved']>[0]) => {
        charging();
        await held;
        return t.payments.chargeSaved(input);
      },
    });
    // A second instance on PostgreSQL: its own storage handle and in-process queue on the same database.
    const other = dialect === 'postgres' ? openStorage(t.database.url, { poolSize: 4 }) : t.storage;
    const otherState = new CommerceState();
    // Time does not move: a wait that polled a clock would never see its deadline pass.
    const clock = new TestClock();
    try {
      const before = t.payments.charges.length;
      const ended: string[] = [];
      const callers = Array.from({ length: 6 }, (_, i) =>
        topUpIfShort(
          { storage: i % 2 === 0 ? t.storage : other, payments: gated, clock, commerceState: i % 2 === 0 || other === t.storage ? commerceState : otherState },
          walletId,
          parseMoney('1'),
          new Date(),
        ).then((r) => {
          ended.push(r);
          return r;
        }),
      );
      await started;
      // Give the others every chance to end early: they may not while the purchase is being paid.
      for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
      expect(ended).toEqual([]);
      release();
      const results = await Promise.all(callers);
      expect(results.filter((r) => r === 'bought')).toHaveLength(1);
      // A caller whose first look came after the purchase finds the wallet covered.
      expect(results.filter((r) => r !== 'bought').every((r) => r === 'bought_by_another' || r === 'covered'), results.join()).toBe(true);
      expect(t.payments.charges.slice(before)).toHaveLength(1);
      expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('5'));
    } finally {
      if (other !== t.storage) await other.close();
    }
  });

  it('a purchase left pending by a purchaser that died is given up at once, not after a wait on the wall clock', async () => {
    const { walletId, customerId } = await subscribedWithBundle('succeeds');
    const sub = await t.storage.db.selectFrom('subscriptions').select(['id', 'merchant_id']).where('connection_id', '=', customerId).executeTakeFirstOrThrow();
    const at = new Date().toISOString();
    await t.storage.db
      .insertInto('payments')
      .values({ id: 'pay_dead_purchaser', merchant_id: sub.merchant_id, connection_id: customerId, provider: 'test', provider_ref: null, purpose: 'auto_top_up', reference: `${sub.id}:1`, amount: parseMoney('4'), status: 'pending', failure_reason: null, created_at: at, updated_at: at })
      .execute();
    const startedAt = performance.now();
    expect(await topUpIfShort(deps(), walletId, parseMoney('1'), new Date())).toBe('payment_failed');
    // The old wait polled for up to 10 s of wall-clock time.
    expect(performance.now() - startedAt).toBeLessThan(2_000);
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
  });

  it('a declined card buys nothing, and a customer without an auto top-up bundle is left alone', async () => {
    const { walletId } = await subscribedWithBundle('declinesLater');
    expect(await topUpIfShort(deps(), walletId, parseMoney('1'), new Date())).toBe('payment_failed');
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
    const plain = await createCustomer(t);
    expect(await topUpIfShort(deps(), plain.walletId, parseMoney('1'), new Date())).toBe('no_auto_top_up');
  });

  it('a caller short only by a hold that does not settle waits HOLD_WAIT_MS on the app clock, then buys', async () => {
    const { walletId } = await subscribedWithBundle('succeeds');
    const clock = new TestClock();
    await creditWallet(t.storage, walletId, parseMoney('2'), new Date(clock.now()).toISOString());
    const hold = await placeHold(t.storage, { now: new Date(clock.now()), walletId, amount: parseMoney('1.5'), reference: `long-call-${dialect}`, ttlMs: 60 * 60_000 });
    if (!('holdId' in hold)) throw new Error('hold refused');
    const state = new CommerceState();
    let ended: string | null = null;
    const caller = topUpIfShort({ storage: t.storage, payments: t.payments, clock, commerceState: state }, walletId, parseMoney('1'), new Date(clock.now())).then((r) => (ended = r));
    await until(() => state.holdWaits.size === 1, 'the caller waits for the hold');
    // The wall clock moves, the app's does not: the caller keeps waiting for the call in flight.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(ended).toBeNull();
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(0n);
    clock.advance(HOLD_WAIT_MS);
    expect(await caller).toBe('bought');
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('5'));
    await releaseHold(t.storage, hold.holdId);
  });
});
