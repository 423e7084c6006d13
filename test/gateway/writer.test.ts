import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { GroupCommitWriter, type BatchJob } from '../../src/ledger/group-commit.ts';
import { ADMIT_JOB, admitRequest } from '../../src/ledger/admission/admit.ts';
import { ADMISSION_WRITE_DELAY_MS, admitDeferred, deferredWrites, releaseDeferredHolds, takeOverAdmission } from '../../src/ledger/admission/deferred.ts';
import { failRequest, SETTLE_JOB, settleRequest, type SettleInput } from '../../src/ledger/settlement/settle.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { openStorage } from '../../src/storage/db.ts';
import { forwardToken, startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { admissionOf, CHAT_FACTS, settlementOf, tokenUsage } from '../helpers/settle.ts';

/** The gateway's group-commit writer: batching, isolation of a failing member, and real settlements. */

/**
 * A job that records each batch it is given and holds the first one until `release()`, so a test
 * can queue work behind a batch being written. `waitMs` makes it work that may wait.
 */
function jobHoldingFirstBatch<T>(waitMs?: number) {
  const batches: T[][] = [];
  let release!: () => void;
  const firstBatchHeld = new Promise<void>((r) => (release = r));
  const job: BatchJob<T, T> = {
    order: 0,
    locks: () => ({}),
    waitMs,
    inTransaction: async (_trx, _dialect, inputs) => {
      batches.push(inputs);
      if (batches.length === 1) await firstBatchHeld;
      return inputs;
    },
    alone: async (_storage, input) => input,
  };
  return { job, batches, release };
}

describe.each(databasesUnderTest())('gateway writer on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => {
    await t?.close();
  });

  it('work handed in together runs in one batch; a failing batch runs each member alone', async () => {
    const writer = new GroupCommitWriter(t.storage);
    const batches: string[][] = [];
    const job: BatchJob<string, string> = {
      order: 0,
      locks: () => ({}),
      inTransaction: async (_trx, _dialect, inputs) => {
        batches.push(inputs);
        if (inputs.includes('bad')) throw new Error('one bad member');
        return inputs.map((i) => `batched ${i}`);
      },
      alone: async (_storage, input) => {
        if (input === 'bad') throw new Error('bad alone');
        return `alone ${input}`;
      },
    };
    expect(await Promise.all(['a', 'b', 'c'].map((i) => writer.run(job, i)))).toEqual(['batched a', 'batched b', 'batched c']);
    expect(batches).toEqual([['a', 'b', 'c']]);

    const outcomes = await Promise.allSettled(['d', 'bad', 'e'].map((i) => writer.run(job, i)));
    expect(outcomes.map((o) => (o.status === 'fulfilled' ? o.value : (o.reason as Error).message))).toEqual([
      'alone d',
      'bad alone',
      'alone e',
    ]);
    await writer.drain();
  });

  it('work that may wait, queued while a batch is written, waits for more to join it instead of following at once', async () => {
    const writer = new GroupCommitWriter(t.storage);
    const { job: lazy, batches, release } = jobHoldingFirstBatch<string>(1000);
    const eager: BatchJob<string, string> = { ...lazy, waitMs: undefined };
    const first = writer.run(eager, 'a');
    await vi.waitFor(() => expect(batches).toEqual([['a']]));
    const second = writer.run(lazy, 'b');
    release();
    await first;
    // 'b' came while 'a' was written: it waits, and 'c', handed in well after 'a' was done, joins it.
    await new Promise((r) => setTimeout(r, 50));
    const third = writer.run(lazy, 'c');
    expect(await Promise.all([second, third])).toEqual(['b', 'c']);
    expect(batches).toEqual([['a'], ['b', 'c']]);

    // A drain does not wait: what is queued is written at once.
    const started = Date.now();
    const fourth = writer.run(lazy, 'd');
    await writer.drain();
    expect(await fourth).toBe('d');
    expect(Date.now() - started).toBeLessThan(900);
  });

  it.each([
    { maxBatch: undefined, full: 64 },
    { maxBatch: 256, full: 256 },
  ])('a full batch ($full) of work that may wait goes at once, so a backlog cannot build up while the writer waits', async ({ maxBatch, full }) => {
    const writer = new GroupCommitWriter(t.storage, undefined, { maxBatch });
    const { job: lazy, batches, release } = jobHoldingFirstBatch<number>(10_000);
    const sizes = () => batches.map((b) => b.length);
    const first = writer.run({ ...lazy, waitMs: undefined }, 0);
    await vi.waitFor(() => expect(sizes()).toEqual([1]));
    // A full batch and more arrive while the first batch is written.
    const total = full + 6;
    const backlog = Array.from({ length: total }, (_, i) => writer.run(lazy, i + 1));
    release();
    await first;
    const written = Promise.all(backlog.slice(0, full)).then(() => 'written');
    expect(await Promise.race([written, new Promise((r) => setTimeout(() => r('still waiting'), 3_000))])).toBe('written');
    expect(sizes().slice(0, 2)).toEqual([1, full]);
    await writer.drain();
    expect(await Promise.all(backlog)).toEqual(Array.from({ length: total }, (_, i) => i + 1));
  });

  it('past four full batches queued, new work is told to wait for room, until a batch takes the queue below that', async () => {
    const writer = new GroupCommitWriter(t.storage, undefined, { maxBatch: 2 });
    const { job, batches, release } = jobHoldingFirstBatch<number>();
    const first = writer.run(job, 0);
    await vi.waitFor(() => expect(batches).toEqual([[0]]));
    // Seven queued behind the held batch: below 4 × 2, so no producer waits.
    const queued = Array.from({ length: 7 }, (_, i) => writer.run(job, i + 1));
    expect(writer.room()).toBeUndefined();
    queued.push(writer.run(job, 8));
    const room = writer.room();
    expect(room).toBeInstanceOf(Promise);
    let roomMade = false;
    void room!.then(() => (roomMade = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(roomMade).toBe(false);

    release();
    await first;
    await vi.waitFor(() => expect(roomMade).toBe(true));
    expect(await Promise.all(queued)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(writer.room()).toBeUndefined();
    await writer.drain();
  });

  it('a batch of settlements with a duplicate member: the others settle, the duplicate charges nothing', async () => {
    const { merchant, secretKey } = await t.newMerchant('Batch').then((m) => ({ merchant: m, secretKey: m.secretKey }));
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
    const billing = await resolveForwardCredential(t.storage, secretKey, new Date());
    const { walletId } = pricingFor(billing);
    const writer = new GroupCommitWriter(t.storage);
    const record = { provider: 'openai', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed' as const, metadata: {} };

    const admitted = await Promise.all(
      [1, 2, 3].map(() =>
        writer.run(ADMIT_JOB, admissionOf(billing, walletId, { hold: '0.01', facts: record })),
      ),
    );
    const ids = admitted.map((a) => {
      if (a.outcome !== 'admitted') throw new Error(a.outcome);
      return a;
    });
    expect((await findWallet(t.storage, merchant.walletId))!.held).toBe(parseMoney('0.03'));

    const input = (a: (typeof ids)[number]): SettleInput =>
      settlementOf(a, {
        billing,
        usage: tokenUsage(100, 50),
        prices: lookupBasePrices('openai', 'gpt-4o', { overrides: t.config.priceOverrides }),
        baseCostCharged: true,
        record,
      });
    expect((await writer.run(SETTLE_JOB, input(ids[0]!))).outcome).toBe('recorded');
    const before = (await findWallet(t.storage, merchant.walletId))!;

    // The first again (a duplicate), with the other two, in one batch.
    const outcomes = await Promise.all([input(ids[0]!), input(ids[1]!), input(ids[2]!)].map((i) => writer.run(SETTLE_JOB, i)));
    expect(outcomes.map((o) => o.outcome)).toEqual(['duplicate', 'recorded', 'recorded']);
    const charged = outcomes.reduce((sum, o) => sum + (o.outcome === 'recorded' ? o.priced.totals.merchant + o.priced.totals.wallet : 0n), 0n);
    const after = (await findWallet(t.storage, merchant.walletId))!;
    expect(after.balance).toBe(before.balance - charged);
    expect(after.held).toBe(0n);
    for (const a of ids) {
      const transactions = await t.storage.db.selectFrom('ledger_transactions').select('id').where('reference', '=', a.recordId).execute();
      expect(transactions.length).toBe(1);
    }
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    await writer.drain();
  });

  it('a batch of 256 settlements (an embedded instance\'s largest) is written in one transaction, each charged once', async () => {
    const merchant = await t.newMerchant('Big batch');
    await creditWallet(t.storage, merchant.walletId, parseMoney('100'));
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const { walletId } = pricingFor(billing);
    const record = { provider: 'openai', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed' as const, metadata: { team: 'a' } };
    const admitted = await Promise.all(Array.from({ length: 256 }, () => new GroupCommitWriter(t.storage).run(ADMIT_JOB, admissionOf(billing, walletId, { hold: '0.01', facts: record }))));
    const prices = lookupBasePrices('openai', 'gpt-4o', { overrides: t.config.priceOverrides });

    const sizes: number[] = [];
    const counted: typeof SETTLE_JOB = { ...SETTLE_JOB, inTransaction: (trx, d, inputs) => (sizes.push(inputs.length), SETTLE_JOB.inTransaction!(trx, d, inputs)) };
    const writer = new GroupCommitWriter(t.storage, undefined, { maxBatch: 256 });
    const balanceEvents = () =>
      t.storage.db.selectFrom('events').select(['id', 'payload']).where('merchant_id', '=', merchant.merchantId).where('type', '=', 'merchant.wallet.balance.updated').orderBy('id').execute();
    const eventsBefore = (await balanceEvents()).length;
    const outcomes = await Promise.all(
      admitted.map((a) => {
        if (a.outcome !== 'admitted') throw new Error(a.outcome);
        return writer.run(counted, settlementOf(a, { billing, usage: tokenUsage(100, 50), prices, baseCostCharged: true, record }));
      }),
    );
    expect(sizes).toEqual([256]);
    expect(outcomes.every((o) => o.outcome === 'recorded')).toBe(true);
    const charged = outcomes.reduce((sum, o) => sum + (o.outcome === 'recorded' ? o.priced.totals.merchant + o.priced.totals.wallet : 0n), 0n);
    expect(charged).toBeGreaterThan(0n);
    expect(await findWallet(t.storage, merchant.walletId)).toMatchObject({ balance: parseMoney('100') - charged, held: 0n });
    const completed = await t.storage.db.selectFrom('requests').select('id').where('merchant_id', '=', merchant.merchantId).where('status', '=', 'completed').execute();
    expect(completed.length).toBe(256);
    // One balance event for the batch, not one per request (a batch that failed and ran member by
    // member would have written one each): the balance and held it left.
    const events = await balanceEvents();
    expect(events.length).toBe(eventsBefore + 1);
    expect(JSON.parse(events.at(-1)!.payload)).toEqual({ wallet_id: merchant.walletId, balance: formatMoney(parseMoney('100') - charged), held: formatMoney(0n) });
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    await writer.drain();
  });

  it('settlements in one batch take tier positions in order, as one by one would', async () => {
    const h = t.auth();
    const customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: {} })).json();
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'Tiered', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '100' }, { start: '300', rate: '50' }] },
      })
    ).json();
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('5'));
    const token = forwardToken(t.merchant.secretKey, customer.customer_id, meter.meter_slug);
    const billing = await resolveForwardCredential(t.storage, token, new Date());
    const writer = new GroupCommitWriter(t.storage);
    const record = { provider: 'openai', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed' as const, metadata: { feature: 'x' } };
    const admitted = await Promise.all(
      [1, 2, 3].map(() =>
        writer.run(ADMIT_JOB, admissionOf(billing, customer.wallet.wallet_id, { hold: '0.1', facts: record })),
      ),
    );
    const outcomes = await Promise.all(
      admitted.map((a) => {
        if (a.outcome !== 'admitted') throw new Error(a.outcome);
        return writer.run(SETTLE_JOB, settlementOf(a, { billing, usage: tokenUsage(100, 50), record }));
      }),
    );
    // 150 tokens each: positions 0, 150 at 100 per 1M; then 300 at 50 per 1M.
    expect(outcomes.map((o) => (o.outcome === 'recorded' ? o.priced.fee.amount : -1n))).toEqual([
      parseMoney('0.015'),
      parseMoney('0.015'),
      parseMoney('0.0075'),
    ]);
    const wallet = (await findWallet(t.storage, customer.wallet.wallet_id))!;
    expect(wallet.balance).toBe(parseMoney('5') - parseMoney('0.0375'));
    expect(wallet.held).toBe(0n);
    const rows = await t.storage.db.selectFrom('requests').select(['status', 'fee_amount']).where('connection_id', '=', customer.customer_id).execute();
    expect(rows.map((r) => r.status)).toEqual(['completed', 'completed', 'completed']);
    const rollups = await t.storage.db.selectFrom('usage_rollups').select(['requests', 'fee']).where('connection_id', '=', customer.customer_id).execute();
    expect(rollups.reduce((sum, r) => sum + BigInt(r.requests), 0n)).toBe(3n);
    expect(rollups.reduce((sum, r) => sum + BigInt(r.fee), 0n)).toBe(parseMoney('0.0375'));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    await writer.drain();
  });

  it('a request admitted before midnight and settled after it counts on its admission day, filtered or not', async () => {
    const merchant = await t.newMerchant('Midnight');
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const record = { provider: 'openai', endpoint: 'POST x', provider_key_type: 'managed' as const, metadata: { team: 'night' } };
    const admit = async (at: string) => {
      const admitted = await admitRequest(
        t.storage,
        // Long enough that no sweep expires it before it settles (the test settles now, years later).
        admissionOf(billing, merchant.walletId, { hold: '0.01', facts: record, ttlMs: 100 * 365 * 86_400_000, now: new Date(at) }),
      );
      if (admitted.outcome !== 'admitted') throw new Error(admitted.outcome);
      return admitted;
    };
    const settlement = (a: Awaited<ReturnType<typeof admit>>): SettleInput =>
      settlementOf(a, {
        billing,
        usage: tokenUsage(1000, 500),
        prices: lookupBasePrices('openai', 'gpt-4o', { overrides: t.config.priceOverrides }),
        baseCostCharged: true,
        record,
      });
    // One settles alone, two in one batch, one fails: all admitted in the last second of 31 March.
    const alone = await admit('2026-03-31T23:59:59.000Z');
    const batched = [await admit('2026-03-31T23:59:59.500Z'), await admit('2026-03-31T23:59:59.900Z')];
    const failed = await admit('2026-03-31T23:59:59.999Z');
    expect((await settleRequest(t.storage, settlement(alone))).outcome).toBe('recorded');
    const outcomes = await t.storage.db.transaction().execute((trx) => SETTLE_JOB.inTransaction!(trx, t.storage.dialect, batched.map(settlement)));
    expect(outcomes.map((o) => o.outcome)).toEqual(['recorded', 'recorded']);
    await failRequest(t.storage, { recordId: failed.recordId, holdIds: failed.holdIds });

    const rows = await t.storage.db
      .selectFrom('requests')
      .select(['created_at', 'status', 'total_merchant_cost'])
      .where('merchant_id', '=', merchant.merchantId)
      .execute();
    expect(rows.every((r) => r.created_at.startsWith('2026-03-31T23:59:59'))).toBe(true);
    expect(rows.map((r) => r.status).sort()).toEqual(['completed', 'completed', 'completed', 'error']);
    const charged = rows.reduce((sum, r) => sum + BigInt(r.total_merchant_cost), 0n);
    expect(charged).toBeGreaterThan(0n);

    const filter = encodeURIComponent(JSON.stringify([['team', 'night']]));
    for (const query of ['start=2026-03-31&end=2026-04-01', `start=2026-03-31&end=2026-04-01&metadata_filters=${filter}`]) {
      const res = await t.app.inject({ method: 'GET', url: `/v1/usage?${query}`, headers: t.auth(merchant.secretKey) });
      expect(res.statusCode).toBe(200);
      const items = res.json().items as { date: string; total_requests: number; total_request_cost: string }[];
      expect(items.map((i) => [i.date, i.total_requests, i.total_request_cost])).toEqual([
        ['2026-03-31', rows.length, formatMoney(charged)],
        ['2026-04-01', 0, formatMoney(0n)],
      ]);
    }
  });

  it('the hold sweeper fails every expired request, batch after batch, its holds and records together', async () => {
    const merchant = await t.newMerchant('Sweep');
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    // Admitted on a clock before every other test's, so only these are due at the sweep.
    const t0 = new Date('2019-05-01T00:00:00.000Z');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      const admitted = await admitRequest(t.storage, admissionOf(billing, merchant.walletId, { hold: '0.01', now: t0 }));
      if (admitted.outcome !== 'admitted') throw new Error(admitted.outcome);
      ids.push(admitted.recordId);
    }
    expect((await findWallet(t.storage, merchant.walletId))!.held).toBe(parseMoney('0.05'));

    expect(await sweepExpiredHolds(t.storage, new Date(t0.getTime() + 60_000), 2)).toBe(5);
    const records = await t.storage.db.selectFrom('requests').select('status').where('id', 'in', ids).execute();
    expect(records.map((r) => r.status)).toEqual(['error', 'error', 'error', 'error', 'error']);
    const holds = await t.storage.db.selectFrom('holds').select('status').where('reference', 'in', ids).execute();
    expect(holds.map((h) => h.status)).toEqual(['expired', 'expired', 'expired', 'expired', 'expired']);
    const wallet = (await findWallet(t.storage, merchant.walletId))!;
    expect(wallet).toMatchObject({ held: 0n, balance: parseMoney('5') });
    const rollups = await t.storage.db.selectFrom('usage_rollups').select('requests').where('merchant_id', '=', merchant.merchantId).execute();
    expect(rollups.reduce((sum, r) => sum + BigInt(r.requests), 0n)).toBe(5n);
    expect(await sweepExpiredHolds(t.storage, new Date(t0.getTime() + 60_000), 2)).toBe(0);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it.runIf(dialect === 'postgres')('the one-statement admission writes everything, or nothing when a wallet cannot cover the batch', async () => {
    const merchant = await t.newMerchant('One statement');
    await creditWallet(t.storage, merchant.walletId, parseMoney('0.05'));
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const input = () => admissionOf(billing, merchant.walletId, { hold: '0.02', facts: { ...CHAT_FACTS, metadata: { k: 'v' } } });
    const fast = ADMIT_JOB.wholeBatch!;
    const two = await fast(t.storage, [input(), input()]);
    expect(two?.map((o) => o.outcome)).toEqual(['admitted', 'admitted']);
    const holds = await t.storage.db.selectFrom('holds').select(['amount', 'status']).where('wallet_id', '=', merchant.walletId).execute();
    expect(holds.length).toBe(2);
    expect((await findWallet(t.storage, merchant.walletId))!.held).toBe(parseMoney('0.04'));
    const metadata = await t.storage.db.selectFrom('request_metadata').select('key').where('merchant_id', '=', merchant.merchantId).execute();
    expect(metadata.length).toBe(2);

    // 0.01 left: a batch needing 0.04 writes nothing.
    await expect(fast(t.storage, [input(), input()])).rejects.toThrow();
    expect((await findWallet(t.storage, merchant.walletId))!.held).toBe(parseMoney('0.04'));
    const records = await t.storage.db.selectFrom('requests').select('id').where('merchant_id', '=', merchant.merchantId).execute();
    expect(records.length).toBe(2);
  });

  it('admissions in one batch never hold more than the wallet has', async () => {
    const merchant = await t.newMerchant('Tight');
    await creditWallet(t.storage, merchant.walletId, parseMoney('0.05'));
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const writer = new GroupCommitWriter(t.storage);
    const outcomes = await Promise.all(
      Array.from({ length: 12 }, () =>
        writer.run(ADMIT_JOB, admissionOf(billing, merchant.walletId, { hold: '0.01', facts: { ...CHAT_FACTS, metadata: { k: 'v' } } })),
      ),
    );
    expect(outcomes.filter((o) => o.outcome === 'admitted').length).toBe(5);
    expect(outcomes.filter((o) => o.outcome === 'insufficient_balance').length).toBe(7);
    const wallet = (await findWallet(t.storage, merchant.walletId))!;
    expect(wallet.held).toBe(parseMoney('0.05'));
    const pending = await t.storage.db.selectFrom('requests').select('id').where('merchant_id', '=', merchant.merchantId).execute();
    expect(pending.length).toBe(5);
    await writer.drain();
  });

  /** A credited customer with a per-request meter, its forward billing and what an admission of it sends. */
  async function embeddedCustomer(credit: string, metadata: Record<string, string>, writeDelayMs = ADMISSION_WRITE_DELAY_MS) {
    const customer = await t.customerWithMeter({ credit });
    const token = forwardToken(t.merchant.secretKey, customer.customerId, customer.meterSlug);
    const billing = await resolveForwardCredential(t.storage, token, new Date());
    const record = { ...CHAT_FACTS, metadata };
    const admission = (hold: string) => admissionOf(billing, customer.walletId, { hold, facts: record });
    const background = new GroupCommitWriter(t.storage);
    return { customer, billing, background, writes: deferredWrites(background, undefined, writeDelayMs), record, admission };
  }

  it.runIf(dialect === 'sqlite')(
    'embedded admission: a hold not written yet still counts against the wallet, and its rows land before its settlement',
    async () => {
      const { customer, billing, background, record, admission, writes } = await embeddedCustomer('0.01', { k: 'v' });

      const first = await admitDeferred(t.storage, writes, admission('0.01'));
      if (first.outcome !== 'admitted') throw new Error(first.outcome);
      // Its hold is only in memory until the background writer commits it: it counts all the same,
      // for the next admission and for a POST /requests charge of the same customer.
      const second = admitDeferred(t.storage, writes, admission('0.001'));
      const charge = t.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers: t.auth(),
        payload: { request_id: 'during-flight', customer_id: customer.customerId, meter_slug: customer.meterSlug },
      });
      expect((await second).outcome).toBe('insufficient_balance');
      expect((await charge).statusCode).toBe(402);

      await first.deferred!.written;
      const wallet = (await findWallet(t.storage, customer.walletId))!;
      expect(wallet.held).toBe(parseMoney('0.01'));
      const hold = await t.storage.db.selectFrom('holds').select(['amount', 'status']).where('reference', '=', first.recordId).executeTakeFirstOrThrow();
      expect(hold).toEqual({ amount: parseMoney('0.01'), status: 'active' });
      const pending = await t.storage.db.selectFrom('requests').select(['status', 'created_at']).where('id', '=', first.recordId).executeTakeFirstOrThrow();
      expect(pending).toEqual({ status: 'pending', created_at: first.createdAt });
      // Written and in memory are never both counted once the write is done.
      expect((await admitDeferred(t.storage, writes, admission('0.001'))).outcome).toBe('insufficient_balance');

      const settled = await background.run(SETTLE_JOB, settlementOf(first, { billing, usage: tokenUsage(10, 5), record }));
      expect(settled.outcome).toBe('recorded');
      const after = (await findWallet(t.storage, customer.walletId))!;
      expect(after.held).toBe(0n);
      expect(after.balance).toBe(parseMoney('0.01') - (settled.outcome === 'recorded' ? settled.priced.totals.wallet : 0n));
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
      await background.drain();
    },
  );

  it.runIf(dialect === 'sqlite')(
    'embedded admission taken over by its settlement: one completed record, no hold rows, the reservation ends with the charge',
    async () => {
      const { customer, billing, background, record, admission, writes } = await embeddedCustomer('0.02', { team: 'a' });

      const admitted = await admitDeferred(t.storage, writes, admission('0.02'));
      if (admitted.outcome !== 'admitted') throw new Error(admitted.outcome);
      expect(takeOverAdmission(admitted.deferred)).toBe(true);
      // Taken over once: a second settlement (or the write itself) finds it no longer queued.
      expect(takeOverAdmission(admitted.deferred)).toBe(false);
      const settled = await background.run(SETTLE_JOB, { ...settlementOf(admitted, { billing, usage: tokenUsage(10, 5), record }), merged: admitted.deferred });
      await admitted.deferred!.written;
      if (settled.outcome !== 'recorded') throw new Error(settled.outcome);
      // The per-request meter charges 0.25: more than the 0.02 held, as a provider overshooting its hold would.
      expect(settled.priced.totals.wallet).toBe(parseMoney('0.25'));

      const stored = await t.storage.db.selectFrom('requests').select(['status', 'created_at', 'total_wallet_cost']).where('id', '=', admitted.recordId).execute();
      expect(stored).toEqual([{ status: 'completed', created_at: admitted.createdAt, total_wallet_cost: parseMoney('0.25') }]);
      const metadata = await t.storage.db.selectFrom('request_metadata').select(['key', 'value']).where('request_pk', '=', admitted.recordId).execute();
      expect(metadata).toEqual([{ key: 'team', value: 'a' }]);
      expect(await t.storage.db.selectFrom('holds').select('id').where('reference', '=', admitted.recordId).execute()).toEqual([]);
      const wallet = (await findWallet(t.storage, customer.walletId))!;
      expect(wallet).toMatchObject({ held: 0n, balance: parseMoney('0.02') - parseMoney('0.25') });

      // Until the settlement's caller ends the reservation it still counts; then only the balance does.
      releaseDeferredHolds(admitted.deferred!);
      await creditWallet(t.storage, customer.walletId, parseMoney('0.24'));
      expect((await admitDeferred(t.storage, writes, admission('0.01'))).outcome).toBe('admitted');
      await background.drain();
    },
  );

  it.runIf(dialect === 'sqlite')(
    'embedded admission decides on the wallet it last read while nothing was written, reads it again after a write of this process',
    async () => {
      // Long enough that neither admission is written before the test takes both over, however slow the machine.
      const { customer, billing, background, record, admission, writes } = await embeddedCustomer('0.05', {}, 60_000);
      const reads = vi.spyOn(t.storage.db, 'connection');
      try {
        const first = await admitDeferred(t.storage, writes, admission('0.02'));
        if (first.outcome !== 'admitted') throw new Error(first.outcome);
        expect(reads).toHaveBeenCalledTimes(1);
        const second = await admitDeferred(t.storage, writes, admission('0.02'));
        if (second.outcome !== 'admitted') throw new Error(second.outcome);
        expect(reads).toHaveBeenCalledTimes(1);

        // Both settle at 0.25 each (the per-request meter): the wallet is at -0.45 once they are written.
        for (const admitted of [first, second]) {
          expect(takeOverAdmission(admitted.deferred)).toBe(true);
          await background.run(SETTLE_JOB, { ...settlementOf(admitted, { billing, usage: tokenUsage(10, 5), record }), merged: admitted.deferred });
          releaseDeferredHolds(admitted.deferred!);
        }
        // The row read before those writes said 0.05 with nothing held: it is not used again.
        expect((await admitDeferred(t.storage, writes, admission('0.001'))).outcome).toBe('insufficient_balance');
        expect(reads).toHaveBeenCalledTimes(2);
      } finally {
        reads.mockRestore();
      }
      expect((await findWallet(t.storage, customer.walletId))!.balance).toBe(parseMoney('-0.45'));
      await background.drain();
    },
  );

  it.runIf(dialect === 'sqlite')(
    'embedded admission takes a refusal against a fresh read: a credit another process made (the CLI) is seen',
    async () => {
      const { customer, background, admission, writes } = await embeddedCustomer('0.05', {});
      expect((await admitDeferred(t.storage, writes, admission('0.01'))).outcome).toBe('admitted');
      // This process does not see another's writes: its last read of the wallet says 0.04 is left.
      const cli = openStorage(t.database.url);
      try {
        await creditWallet(cli, customer.walletId, parseMoney('1'));
      } finally {
        await cli.close();
      }
      expect((await admitDeferred(t.storage, writes, admission('0.5'))).outcome).toBe('admitted');
      await background.drain();
    },
  );
});
