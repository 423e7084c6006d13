import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { HoldKeeper } from '../../src/ledger/hold-keeper.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { WalletLeases, type Lease } from '../../src/ledger/leases.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type Merchant, startTestApp, type TestApp } from '../helpers/app.ts';
import { openaiHoldOf, startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

/**
 * Wallet leases (decision 0013, PostgreSQL only): a hot wallet's requests are admitted from a
 * slice this instance reserved as a hold row of its own, and written later. These tests make
 * every wallet hot from its first request (WALLET_LEASE_HOT_AFTER=0) and prove that the money
 * stays exact: what other instances may admit, what a settlement charges, what is held, and that
 * a lease is given back when idle and at shutdown, and replaced when it expired.
 */

const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;
const LEASE_ENV = { WALLET_LEASE_HOT_AFTER: '0', WALLET_LEASE_IDLE_MS: '300', HOLD_TTL_MS: '60000' };
const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 2000, messages: [{ role: 'user', content: 'one two three four five six seven eight' }] });
// Costs more than its hold when the mock reports 40 times its usage (overReport).
const costly = JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: Array(300).fill('a').join(' ') }] });

describe.skipIf(!process.env.TEST_DATABASE_URL)('wallet leases on postgres', () => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock('postgres', {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-managed-openai' },
      env: LEASE_ENV,
    }));
  });
  afterEach(() => upstream.reset());
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const wallet = async (id: string) => (await findWallet(t.storage, id))!;
  const activeHolds = (walletId: string) =>
    t.storage.db.selectFrom('holds').select(['id', 'reference', 'amount']).where('wallet_id', '=', walletId).where('status', '=', 'active').execute();
  /** A lease is a hold whose reference is its own id. */
  const leasesOf = async (walletId: string) => (await activeHolds(walletId)).filter((h) => h.reference === h.id);

  /** A second instance on the same database, mock upstream and clock; `env` over the lease settings. */
  const anotherInstance = (env: Record<string, string>) =>
    startTestApp('postgres', {
      database: t.database,
      clock: t.clock,
      env: {
        ...LEASE_ENV,
        UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }),
        PROVIDER_KEYS: JSON.stringify({ openai: 'sk-managed-openai' }),
        ...env,
      },
    });


  function post(at: string, credential: string, payload: string): Promise<Response> {
    return fetch(`${at}/v1/forward?${OPENAI_CHAT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json' },
      body: payload,
    });
  }

  /** The hold the gateway places for `payload` paid by the merchant. */
  async function holdFor(merchant: Merchant, payload: string): Promise<bigint> {
    const estimate = await openaiHoldOf(t, merchant.secretKey, JSON.parse(payload) as { model: string });
    return estimate.wallet + estimate.merchant;
  }

  async function settledCost(merchant: Merchant, res: Response): Promise<bigint> {
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect(record.status).toBe('completed');
    return parseMoney(record.total_merchant_cost) + parseMoney(record.total_wallet_cost);
  }

  /** A new merchant whose wallet holds 1000 times the hold of `body`. */
  async function merchantFundedFor1000Holds(name: string) {
    const merchant = await t.newMerchant(name);
    const hold = await holdFor(merchant, body);
    const funded = hold * 1000n;
    await creditWallet(t.storage, merchant.walletId, funded, new Date().toISOString());
    return { merchant, hold, funded };
  }

  it('tops a lease up in the background once fewer than 16 requests are left in it, before any request has to wait', async () => {
    const { merchant, hold, funded } = await merchantFundedFor1000Holds('Refilled');
    // An idle lifetime far beyond the test's: on a loaded host a gap between two of its requests
    // can pass this file's 300 ms and retire the lease mid-way.
    const patient = await anotherInstance({ WALLET_LEASE_IDLE_MS: '600000' });
    try {
      const patientBase = await patient.listen();
      // The lease opens with 64 holds; after the 49th request 15 are left, and 64 more are added
      // (the fewest a top-up takes: the requests come 100 ms apart on the app's clock, a slow rate).
      let charged = 0n;
      for (let i = 0; i < 50; i++) {
        charged += await settledCost(merchant, await post(patientBase, merchant.secretKey, body));
        t.clock.advance(100);
      }

      await until(async () => BigInt((await leasesOf(merchant.walletId))[0]?.amount ?? 0) === hold * (64n + 64n - 50n), 'the lease is topped up');
      expect(await leasesOf(merchant.walletId)).toHaveLength(1);
      expect(await wallet(merchant.walletId)).toMatchObject({ balance: funded - charged, held: hold * 78n });
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    } finally {
      await patient.close();
    }
  });

  it('a wallet admitting fast gets top-ups sized to its rate (about 100 ms of it), not 64 requests at a time', async () => {
    const { merchant, hold } = await merchantFundedFor1000Holds('Fast');
    await creditWallet(t.storage, merchant.walletId, hold * 100_000n, new Date().toISOString());
    const keeper = new HoldKeeper(t.storage, 60_000, t.app.log, t.clock);
    const leases = new WalletLeases(t.storage, keeper, { hotAfter: 0, idleMs: 600_000, ttlMs: 60_000 }, t.app.log, t.clock);
    try {
      // The lease opens with 64 shares; 49 admissions taken in a moment leave 15, the refill starts,
      // and it is sized by their rate: far above 640 a second, so far more than 64 shares.
      const taken: Lease[] = [];
      for (let i = 0; i < 49; i++) taken.push((await leases.take(merchant.walletId, hold))!);
      await until(async () => BigInt((await leasesOf(merchant.walletId))[0]?.amount ?? 0) > hold * 64n, 'the lease is topped up');
      const [lease] = await leasesOf(merchant.walletId);
      expect(BigInt(lease!.amount) % hold).toBe(0n);
      const shares = BigInt(lease!.amount) / hold - 64n;
      expect(shares).toBeGreaterThan(64n);
      expect(shares).toBeLessThanOrEqual(4096n);
      for (const share of taken) leases.giveBack(share, hold);
    } finally {
      await leases.close();
      await keeper.close();
    }
    expect((await wallet(merchant.walletId)).held).toBe(0n);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it("serves a hot wallet's requests from one lease with no hold row per request, charges them exactly, and gives the lease back once idle", async () => {
    const { merchant, hold, funded } = await merchantFundedFor1000Holds('Leased');
    // Requests not written for a minute: however slow the host, each is answered and settled long
    // before it would get hold rows of its own (with 50 ms, a loaded host sometimes gave it one).
    const unhurried = await anotherInstance({ ADMISSION_WRITE_DELAY_MS: '60000' });
    try {
      const unhurriedBase = await unhurried.listen();
      let charged = 0n;
      const ids: string[] = [];
      for (let i = 0; i < 10; i++) {
        const res = await post(unhurriedBase, merchant.secretKey, body);
        ids.push(res.headers.get('x-tollgate-request-id')!);
        charged += await settledCost(merchant, res);
      }

      // One lease of 64 requests' holds (a quarter of the wallet is more), and not one hold row per request.
      const [lease, ...others] = await leasesOf(merchant.walletId);
      expect(others).toEqual([]);
      expect(lease).toBeDefined();
      const everyHold = await t.storage.db.selectFrom('holds').select('reference').where('wallet_id', '=', merchant.walletId).execute();
      expect(everyHold.map((h) => h.reference)).toEqual([lease!.id]);
      // Each settlement moved its request's share out of the lease: what is held is what the lease has left.
      expect(BigInt(lease!.amount)).toBe(hold * 64n - hold * 10n);
      const during = await wallet(merchant.walletId);
      expect(during).toMatchObject({ balance: funded - charged, held: BigInt(lease!.amount) });
      expect((await verifyLedger(t.storage)).problems).toEqual([]);

      // Idle past WALLET_LEASE_IDLE_MS on the app's clock.
      t.clock.advance(301);
      await until(async () => (await leasesOf(merchant.walletId)).length === 0, 'the idle lease is given back');
      expect(await wallet(merchant.walletId)).toMatchObject({ balance: funded - charged, held: 0n });
      const given = await t.storage.db.selectFrom('holds').select('status').where('id', '=', lease!.id).executeTakeFirstOrThrow();
      expect(given.status).toBe('released');
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    } finally {
      await unhurried.close();
    }
  });

  it('two instances sharing a wallet that covers 3 holds admit exactly 3 of 20 concurrent requests', async () => {
    const other = await anotherInstance({});
    try {
      const otherBase = await other.listen();
      const merchant = await t.newMerchant('Shared');
      const hold = await holdFor(merchant, body);
      // Room for 3 holds and half of another: a lease never takes more than a quarter of what is
      // available beyond what its request needs, so each instance's leases grow one hold at a time.
      const funded = hold * 3n + hold / 2n;
      await creditWallet(t.storage, merchant.walletId, funded, new Date().toISOString());

      upstream.setNext({ path: '/chat/completions', delayMs: 500, times: 20 });
      const before = upstream.requests.length;
      const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => post(i % 2 === 0 ? base : otherBase, merchant.secretKey, body)));
      const admitted = responses.filter((res) => res.status === 200);
      const refused = responses.filter((res) => res.status === 402);
      expect(admitted.length).toBe(3);
      expect(refused.length).toBe(17);
      for (const res of refused) await res.arrayBuffer();
      let charged = 0n;
      for (const res of admitted) charged += await settledCost(merchant, res);
      expect(upstream.requests.length - before).toBe(3);

      t.clock.advance(301);
      await until(async () => (await leasesOf(merchant.walletId)).length === 0, 'both instances gave their leases back');
      expect(await wallet(merchant.walletId)).toMatchObject({ balance: funded - charged, held: 0n });
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    } finally {
      await other.close();
    }
  });

  it('a request costing more than its hold overruns its wallet: its lease is given back and the next admission is decided in the database, which ends the overrun', async () => {
    const merchant = await t.newMerchant('Overrun');
    const hold = await holdFor(merchant, costly);
    await creditWallet(t.storage, merchant.walletId, hold * 1000n, new Date().toISOString());

    upstream.setNext({ path: '/chat/completions', overReport: 40 });
    const actual = await settledCost(merchant, await post(base, merchant.secretKey, costly));
    expect(actual).toBeGreaterThan(hold);
    // Nothing more is taken from the lease (decision 0019); with nothing in it in flight, it is given back.
    await until(async () => (await leasesOf(merchant.walletId)).length === 0, 'the lease is given back');
    const overrun = await wallet(merchant.walletId);
    expect(overrun).toMatchObject({ balance: hold * 1000n - actual, held: 0n });
    // The excess per thousand held (decision 0025).
    expect(overrun.overrun).toBe(Number(((actual - hold) * 1_000n + hold - 1n) / hold));

    // Nothing is in flight: the wallet admits again, in the database, and its overrun ends.
    const next = await settledCost(merchant, await post(base, merchant.secretKey, costly));
    const after = await wallet(merchant.walletId);
    expect(after.balance).toBe(hold * 1000n - actual - next);
    expect(after.overrun).toBe(0);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a request still running after the write delay gets its own hold, carved out of the lease', async () => {
    const merchant = await t.newMerchant('Slow');
    const hold = await holdFor(merchant, body);
    await creditWallet(t.storage, merchant.walletId, hold * 1000n, new Date().toISOString());

    upstream.setNext({ path: '/chat/completions', delayMs: 400, times: 1 });
    const pending = post(base, merchant.secretKey, body);
    await until(async () => (await activeHolds(merchant.walletId)).some((h) => h.reference !== h.id), 'the running request has a hold row');
    const holds = await activeHolds(merchant.walletId);
    const own = holds.find((h) => h.reference !== h.id)!;
    const [lease] = holds.filter((h) => h.reference === h.id);
    expect(BigInt(own.amount)).toBe(hold);
    expect(BigInt(lease!.amount)).toBe(hold * 63n);
    // Carving moves the share; nothing more is held.
    expect((await wallet(merchant.walletId)).held).toBe(hold * 64n);
    const running = await t.app.inject({ method: 'GET', url: `/v1/requests/${own.reference}`, headers: t.auth(merchant.secretKey) });
    expect(running.json()).toMatchObject({ status: 'pending' });

    const res = await pending;
    const actual = await settledCost(merchant, res);
    expect(res.headers.get('x-tollgate-request-id')).toBe(own.reference);
    const settled = await t.storage.db.selectFrom('holds').select('status').where('id', '=', own.id).executeTakeFirstOrThrow();
    expect(settled.status).toBe('settled');
    // (The lease itself may be given back by now: it has been idle since the request was taken.)
    expect((await wallet(merchant.walletId)).balance).toBe(hold * 1000n - actual);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a lease that expired is not settled against: the request is charged exactly and a new lease replaces it', async () => {
    const merchant = await t.newMerchant('Expired');
    const hold = await holdFor(merchant, body);
    const funded = hold * 1000n;
    await creditWallet(t.storage, merchant.walletId, funded, new Date().toISOString());
    let charged = await settledCost(merchant, await post(base, merchant.secretKey, body));
    const [first] = await leasesOf(merchant.walletId);

    // As if this instance had stopped renewing it: the sweeper expires the lease.
    await t.storage.db.updateTable('holds').set({ expires_at: new Date(t.clock.now() - 1000).toISOString() }).where('id', '=', first!.id).execute();
    await sweepExpiredHolds(t.storage, dateOf(t.clock));
    expect((await wallet(merchant.walletId)).held).toBe(0n);

    // The instance still believes in its lease: the settlement finds it gone and holds the request anew.
    charged += await settledCost(merchant, await post(base, merchant.secretKey, body));
    expect((await wallet(merchant.walletId)).balance).toBe(funded - charged);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);

    charged += await settledCost(merchant, await post(base, merchant.secretKey, body));
    const [second] = await leasesOf(merchant.walletId);
    expect(second!.id).not.toBe(first!.id);
    expect(await wallet(merchant.walletId)).toMatchObject({ balance: funded - charged, held: BigInt(second!.amount) });
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a request its lease cannot cover is decided in the database, not refused: admitted once the wallet can pay, charged once', async () => {
    const merchant = await t.newMerchant('Fallback');
    await creditWallet(t.storage, merchant.walletId, parseMoney('10'), new Date().toISOString());
    // The customer pays a fixed 0.01 a request and the merchant the rest: each request holds on both wallets.
    const fee = parseMoney('0.01');
    const customer = await t.customerWithMeter({
      credit: '0.01',
      secretKey: merchant.secretKey,
      meter: { name: 'Fee', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.01' }], base_cost_payer: 'merchant', service_charge_payer: 'merchant' },
    });
    const token = forwardToken(merchant.secretKey, customer.customerId, customer.meterSlug);
    // Ids grow with time: the merchant's wallet is locked first by any writer locking both.
    expect(merchant.walletId < customer.walletId).toBe(true);

    const first = await post(base, token, body);
    expect(first.status).toBe(200);
    await t.settledRecord(first.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect((await wallet(customer.walletId)).balance).toBe(0n);

    // The merchant's wallet is locked elsewhere. The next request's customer lease is short and its
    // top-up refused (the customer has nothing left); its admission in the database then waits for
    // the merchant's wallet, and meanwhile the customer is credited.
    let unlock!: () => void;
    const unlocked = new Promise<void>((resolve) => (unlock = resolve));
    let lockedBy!: (pid: number) => void;
    const locker = new Promise<number>((resolve) => (lockedBy = resolve));
    const lock = t.storage.db.transaction().execute(async (trx) => {
      await trx.selectFrom('wallets').select('id').where('id', '=', merchant.walletId).forUpdate().execute();
      const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(trx);
      lockedBy(rows[0]!.pid);
      await unlocked;
    });
    try {
      const pid = await locker;
      const before = upstream.requests.length;
      let answered: Response | undefined;
      const second = post(base, token, body).then((res) => (answered = res));
      const waiting = async () => {
        const { rows } = await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where ${pid} = any(pg_blocking_pids(pid))`.execute(t.storage.db);
        return rows[0]!.n > 0;
      };
      await until(async () => answered !== undefined || (await waiting()), 'the admission waits for the merchant wallet');
      // Not answered (a refusal would have been, at once): it waits to be decided in the database.
      expect(answered?.status).toBeUndefined();
      await creditWallet(t.storage, customer.walletId, fee, new Date().toISOString());
      unlock();
      const res = await second;
      expect(res.status).toBe(200);
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
      expect(record.status).toBe('completed');
      expect(upstream.requests.length - before).toBe(1);
      const charges = await t.storage.db.selectFrom('ledger_transactions').select('id').where('kind', '=', 'request_charge').where('reference', '=', record.request_id as string).execute();
      expect(charges).toHaveLength(1);
      const records = await t.storage.db.selectFrom('requests').select('id').where('connection_id', '=', record.connection_id as string).execute();
      expect(records).toHaveLength(2);
      expect((await wallet(customer.walletId)).balance).toBe(0n);
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    } finally {
      unlock();
      await lock;
    }
  });

  it("a dead instance's lease returns once its own short lifetime is over: the wallet pays again without waiting for a hold TTL or a sweep", async () => {
    const merchant = await t.newMerchant('Orphaned lease');
    const hold = await holdFor(merchant, body);
    // Room for 3 holds and a half, all of it in the dead instance's lease: with nothing left
    // available, no background refill can grow the lease after this test reads it.
    const funded = hold * 3n + hold / 2n;
    await creditWallet(t.storage, merchant.walletId, funded, new Date().toISOString());

    // Another instance leases the wallet, then dies: its keeper stops renewing, nothing is given back.
    const leaseTtlMs = t.config.walletLeaseTtlMs;
    const deadKeeper = new HoldKeeper(t.storage, leaseTtlMs, t.app.log, t.clock);
    const dead = new WalletLeases(t.storage, deadKeeper, { hotAfter: 0, idleMs: 3_600_000, ttlMs: leaseTtlMs }, t.app.log, t.clock);
    expect(await dead.take(merchant.walletId, funded)).not.toBeNull();
    await deadKeeper.close();
    const [orphan] = await leasesOf(merchant.walletId);
    expect(BigInt(orphan!.amount)).toBe(funded);

    // While its lifetime lasts, the slice is reserved: the wallet cannot cover another hold.
    const refused = await post(base, merchant.secretKey, body);
    expect(refused.status).toBe(402);
    await refused.arrayBuffer();

    // Seconds later, not HOLD_TTL_MS (60 s here) later, and with no sweep run: the slice is back.
    t.clock.advance(leaseTtlMs + 1);
    const charged = await settledCost(merchant, await post(base, merchant.secretKey, body));
    const gone = await t.storage.db.selectFrom('holds').select('status').where('id', '=', orphan!.id).executeTakeFirstOrThrow();
    expect(gone.status).toBe('expired');
    expect((await wallet(merchant.walletId)).balance).toBe(funded - charged);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a wallet is served from a lease only once it turns hot; before that every request holds on its own', async () => {
    const cool = await anotherInstance({ WALLET_LEASE_HOT_AFTER: '3' });
    try {
      const coolBase = await cool.listen();
      const merchant = await t.newMerchant('Warming');
      await creditWallet(t.storage, merchant.walletId, parseMoney('100'), new Date().toISOString());
      // Sent one after the other, well within the one-second window; settled afterwards.
      const responses: Response[] = [];
      for (let i = 0; i < 5; i++) {
        const res = await post(coolBase, merchant.secretKey, body);
        await res.arrayBuffer();
        responses.push(res);
      }
      const references = responses.map((res) => res.headers.get('x-tollgate-request-id')!);
      for (const id of references) expect((await t.settledRecord(id, t.auth(merchant.secretKey))).status).toBe('completed');
      const holds = await t.storage.db.selectFrom('holds').select(['id', 'reference']).where('wallet_id', '=', merchant.walletId).orderBy('created_at').execute();
      // The first three were admitted in the database, each with its own hold; the rest from one lease.
      const own = holds.filter((h) => h.reference !== h.id).map((h) => h.reference);
      expect(own.sort()).toEqual(references.slice(0, 3).sort());
      expect(holds.filter((h) => h.reference === h.id)).toHaveLength(1);
    } finally {
      await cool.close();
    }
  });

  it('a graceful shutdown gives every lease back', async () => {
    const gateway = await startGatewayOnMock('postgres', {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-managed-openai' },
      env: { ...LEASE_ENV, WALLET_LEASE_IDLE_MS: '600000' },
    });
    try {
      const merchant = await gateway.t.newMerchant('Closing');
      await creditWallet(gateway.t.storage, merchant.walletId, parseMoney('100'), new Date().toISOString());
      const res = await post(gateway.base, merchant.secretKey, body);
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      await gateway.t.settledRecord(res.headers.get('x-tollgate-request-id')!, gateway.t.auth(merchant.secretKey));
      expect((await findWallet(gateway.t.storage, merchant.walletId))!.held).toBeGreaterThan(0n);

      await gateway.t.app.close();
      expect((await findWallet(gateway.t.storage, merchant.walletId))!.held).toBe(0n);
      const active = await gateway.t.storage.db.selectFrom('holds').select('id').where('wallet_id', '=', merchant.walletId).where('status', '=', 'active').execute();
      expect(active).toEqual([]);
      expect((await verifyLedger(gateway.t.storage)).problems).toEqual([]);
    } finally {
      await gateway.t.storage.close();
      await gateway.upstream.close();
    }
  });
});
