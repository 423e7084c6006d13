import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import type { Usage } from '../../src/domain/pricing.ts';
import { parseWalletAccount } from '../../src/ledger/accounts.ts';
import { chargeRequest, type ChargeInput } from '../../src/ledger/charge.ts';
import { expireHolds, placeHold, releaseHold } from '../../src/ledger/holds.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { findConnection } from '../../src/storage/connections.ts';
import { openStorage } from '../../src/storage/db.ts';
import { createMerchant, findMerchant } from '../../src/storage/merchants.ts';
import { findMeter } from '../../src/storage/meters.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { tollgate } from '../helpers/cli.ts';
import { databasesUnderTest, freshDatabase } from '../helpers/databases.ts';

const usd = parseMoney;
const NO_USAGE: Usage = { inputTokens: 0, outputTokens: 0, inputCharacters: 0, outputCharacters: 0, inputSeconds: '0', outputSeconds: '0' };
const MINUTE = 60_000;

describe.each(databasesUnderTest())('ledger on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  let sequence = 0;

  /** A fresh merchant, one customer funded with `fund`, and a per-request meter at `rate`. */
  async function setup(opts: { fund: string; rate: string }) {
    const m = await t.newMerchant();
    const headers = t.auth(m.secretKey);
    const customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json<{
      customer_id: string;
      wallet: { wallet_id: string };
    }>();
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers,
        payload: { name: 'Calls', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: opts.rate }] },
      })
    ).json<{ meter_id: string; meter_slug: string }>();
    if (usd(opts.fund) > 0n) await creditWallet(t.storage, customer.wallet.wallet_id, usd(opts.fund), new Date().toISOString());
    const walletId = customer.wallet.wallet_id;
    const wallet = async () => (await findWallet(t.storage, walletId))!;
    const post = (requestId = `ledger-${++sequence}`) =>
      t.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers,
        payload: { request_id: requestId, customer_id: customer.customer_id, meter_slug: meter.meter_slug },
      });
    /** The ChargeInput a forwarded request would settle with (as the gateway builds it). */
    const chargeInput = async (requestId: string, extra: Partial<ChargeInput> = {}): Promise<ChargeInput> => ({ now: new Date(),
      merchant: (await findMerchant(t.storage, m.merchantId))!,
      connection: (await findConnection(t.storage, m.merchantId, customer.customer_id))!,
      meter: (await findMeter(t.storage, m.merchantId, meter.meter_id))!,
      requestId,
      bodyHash: null,
      usage: NO_USAGE,
      provider: 'custom',
      model: null,
      endpoint: 'POST /v1/forward',
      providerKeyType: 'managed',
      basePrices: null,
      serviceChargeRate: 0n,
      metadata: {},
      ...extra,
    });
    return { m, headers, customer, meter, walletId, wallet, post, chargeInput };
  }

  describe('holds', () => {
    it('a hold reduces the available balance: a request that needs more than balance − held gets 402', async () => {
      const s = await setup({ fund: '1', rate: '0.5' });
      const hold = await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: usd('0.7'), reference: 'h-avail', ttlMs: MINUTE });
      expect(hold).toEqual({ holdId: expect.any(String) });
      expect(await s.wallet()).toMatchObject({ balance: usd('1'), held: usd('0.7') });

      // available = 1 − 0.7 = 0.3 < 0.5
      const refused = await s.post();
      expect(refused.statusCode).toBe(402);
      expect(refused.json().error.code).toBe('insufficient_balance');
      // A second hold larger than what is left is refused too, and reports the available amount.
      expect(await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: usd('0.31'), reference: 'h-2', ttlMs: MINUTE })).toEqual({
        insufficient: { available: usd('0.3') },
      });
      expect((await s.wallet()).held).toBe(usd('0.7'));
    });

    it('releasing a hold restores the available balance, and a hold is released only once', async () => {
      const s = await setup({ fund: '1', rate: '0.5' });
      const hold = await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: usd('0.7'), reference: 'h-release', ttlMs: MINUTE });
      if (!('holdId' in hold)) throw new Error('hold refused');
      expect((await s.post()).statusCode).toBe(402);

      expect(await releaseHold(t.storage, hold.holdId)).toBe(true);
      expect((await s.wallet()).held).toBe(0n);
      expect(await releaseHold(t.storage, hold.holdId)).toBe(false);
      expect((await s.wallet()).held).toBe(0n);
      expect(await releaseHold(t.storage, 'hold_unknown')).toBe(false);

      // available is back to 1: two requests of 0.5 pass, the third is refused
      expect((await s.post()).statusCode).toBe(201);
      expect((await s.post()).statusCode).toBe(201);
      expect((await s.post()).statusCode).toBe(402);
      expect(await s.wallet()).toMatchObject({ balance: 0n, held: 0n });
    });

    it('a wallet at or below zero cannot place even an empty hold', async () => {
      const s = await setup({ fund: '0', rate: '0.5' });
      expect(await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: 0n, reference: 'h-zero', ttlMs: MINUTE })).toEqual({
        insufficient: { available: 0n },
      });
      await expect(placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: -1n, reference: 'h-neg', ttlMs: MINUTE })).rejects.toThrow(RangeError);
    });

    it('expireHolds releases only the holds past their expiry', async () => {
      const s = await setup({ fund: '10', rate: '1' });
      // A clock far in the past, so holds other tests placed "now" are never due here.
      const t0 = new Date('2020-01-01T00:00:00.000Z');
      const soon = await placeHold(t.storage, { walletId: s.walletId, amount: usd('1'), reference: 'exp-soon', ttlMs: MINUTE, now: t0 });
      const later = await placeHold(t.storage, { walletId: s.walletId, amount: usd('2'), reference: 'exp-later', ttlMs: 10 * MINUTE, now: t0 });
      expect('holdId' in soon && 'holdId' in later).toBe(true);
      expect((await s.wallet()).held).toBe(usd('3'));

      // Not yet due: one millisecond before the first expiry.
      expect(await expireHolds(t.storage, new Date(t0.getTime() + MINUTE - 1))).not.toContain('exp-soon');
      expect((await s.wallet()).held).toBe(usd('3'));

      // Two minutes on: only the one-minute hold is due (expiry is inclusive).
      const expired = await expireHolds(t.storage, new Date(t0.getTime() + 2 * MINUTE));
      expect(expired).toContain('exp-soon');
      expect(expired).not.toContain('exp-later');
      expect((await s.wallet()).held).toBe(usd('2'));
      const statuses = await t.storage.db
        .selectFrom('holds')
        .select(['reference', 'status'])
        .where('wallet_id', '=', s.walletId)
        .orderBy('reference')
        .execute();
      expect(statuses).toEqual([
        { reference: 'exp-later', status: 'active' },
        { reference: 'exp-soon', status: 'expired' },
      ]);
      // Running it again expires nothing new; an expired hold cannot be released afterwards.
      expect(await expireHolds(t.storage, new Date(t0.getTime() + 2 * MINUTE))).not.toContain('exp-soon');
      if ('holdId' in soon) expect(await releaseHold(t.storage, soon.holdId)).toBe(false);
      expect((await s.wallet()).held).toBe(usd('2'));
    });

    it('expireHolds keeps going batch after batch until every due hold is expired', async () => {
      const s = await setup({ fund: '10', rate: '1' });
      // A clock before every other test's, so only these five holds are due.
      const t0 = new Date('2019-06-01T00:00:00.000Z');
      for (let i = 1; i <= 5; i++) {
        await placeHold(t.storage, { walletId: s.walletId, amount: usd('1'), reference: `batch-${i}`, ttlMs: MINUTE, now: t0 });
      }
      const batches: string[][] = [];
      const expired = await expireHolds(t.storage, new Date(t0.getTime() + MINUTE), {
        batchSize: 2,
        inSameTransaction: async (_trx, references) => batches.push(references),
      });
      expect(expired.sort()).toEqual(['batch-1', 'batch-2', 'batch-3', 'batch-4', 'batch-5']);
      expect(batches.map((b) => b.length)).toEqual([2, 2, 1]);
      expect((await s.wallet()).held).toBe(0n);
    });

    it('a batch whose work in the same transaction fails expires nothing', async () => {
      const s = await setup({ fund: '10', rate: '1' });
      const t0 = new Date('2019-07-01T00:00:00.000Z');
      const hold = await placeHold(t.storage, { walletId: s.walletId, amount: usd('1'), reference: 'crash-1', ttlMs: MINUTE, now: t0 });
      if (!('holdId' in hold)) throw new Error('hold refused');
      const sweep = expireHolds(t.storage, new Date(t0.getTime() + MINUTE), {
        inSameTransaction: async () => {
          throw new Error('crash between expiring and failing the record');
        },
      });
      await expect(sweep).rejects.toThrow('crash between');
      const row = await t.storage.db.selectFrom('holds').select('status').where('id', '=', hold.holdId).executeTakeFirstOrThrow();
      expect(row.status).toBe('active');
      expect((await s.wallet()).held).toBe(usd('1'));
      expect(await expireHolds(t.storage, new Date(t0.getTime() + MINUTE))).toContain('crash-1');
      expect((await s.wallet()).held).toBe(0n);
    });

    it('a charge settles its hold once, may exceed it, and a second settlement of the same hold does nothing', async () => {
      const s = await setup({ fund: '0.4', rate: '0.5' });
      const hold = await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: usd('0.3'), reference: 'fwd-1', ttlMs: MINUTE });
      if (!('holdId' in hold)) throw new Error('hold refused');

      // Actual cost 0.5 > hold 0.3 and > available 0.1: admitted at the hold, so it is charged in full.
      const settled = await chargeRequest(t.storage, await s.chargeInput('fwd-1', { holdId: hold.holdId }));
      expect(settled.outcome).toBe('recorded');
      // 0.4 − 0.5 = −0.1 ; the hold is gone
      expect(await s.wallet()).toMatchObject({ balance: -usd('0.1'), held: 0n });
      const holdRow = await t.storage.db.selectFrom('holds').select('status').where('id', '=', hold.holdId).executeTakeFirstOrThrow();
      expect(holdRow.status).toBe('settled');

      // The same request settled again: a duplicate, nothing charged.
      expect((await chargeRequest(t.storage, await s.chargeInput('fwd-1', { holdId: hold.holdId }))).outcome).toBe('duplicate');
      // The same hold settled under another request id: still nothing charged.
      const again = await chargeRequest(t.storage, await s.chargeInput('fwd-1-retry', { holdId: hold.holdId }));
      expect(again.outcome).not.toBe('recorded');
      expect(await s.wallet()).toMatchObject({ balance: -usd('0.1'), held: 0n });
      const records = await t.storage.db.selectFrom('requests').select('request_id').where('merchant_id', '=', s.m.merchantId).execute();
      expect(records.map((r) => r.request_id)).toEqual(['fwd-1']);

      // A wallet at or below zero gets 402 until it is credited.
      expect((await s.post()).statusCode).toBe(402);
      expect(await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: 0n, reference: 'h-after', ttlMs: MINUTE })).toEqual({
        insufficient: { available: -usd('0.1') },
      });
    });

    it('a settlement that arrives after its hold expired or was released charges nothing', async () => {
      const s = await setup({ fund: '1', rate: '0.5' });
      const t0 = new Date('2020-02-01T00:00:00.000Z');
      const expiring = await placeHold(t.storage, { walletId: s.walletId, amount: usd('0.5'), reference: 'late-1', ttlMs: MINUTE, now: t0 });
      const released = await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: usd('0.5'), reference: 'late-2', ttlMs: MINUTE });
      if (!('holdId' in expiring) || !('holdId' in released)) throw new Error('hold refused');
      expect(await expireHolds(t.storage, new Date(t0.getTime() + MINUTE))).toContain('late-1');
      expect(await releaseHold(t.storage, released.holdId)).toBe(true);

      expect((await chargeRequest(t.storage, await s.chargeInput('late-1', { holdId: expiring.holdId }))).outcome).toBe('duplicate');
      expect((await chargeRequest(t.storage, await s.chargeInput('late-2', { holdId: released.holdId }))).outcome).toBe('duplicate');
      expect(await s.wallet()).toMatchObject({ balance: usd('1'), held: 0n });
      expect(await t.storage.db.selectFrom('requests').select('id').where('merchant_id', '=', s.m.merchantId).execute()).toEqual([]);
    });

    it('a charge without a hold never takes the balance below zero', async () => {
      const s = await setup({ fund: '0.4', rate: '0.5' });
      expect(await chargeRequest(t.storage, await s.chargeInput('no-hold'))).toEqual({
        outcome: 'insufficient_balance',
        payer: 'wallet',
        needed: usd('0.5'),
        available: usd('0.4'),
      });
      expect((await s.wallet()).balance).toBe(usd('0.4'));
    });
  });

  describe('buckets', () => {
    it('a charge on a meter the plan links takes subscription cycle credit first, then bundle credit, then the prepaid balance', async () => {
      const s = await setup({ fund: '10', rate: '2.5' });
      // A free plan linking the meter grants the cycle credit (only linked meters draw plan credit, decision 0016).
      const plan = await t.app.inject({
        method: 'POST',
        url: '/v1/plans',
        headers: s.headers,
        payload: { name: 'Linked', period_amount: '0', included_credit: '1', billing_interval: 'month', meter_ids: [s.meter.meter_id] },
      });
      const subscribed = await t.app.inject({ method: 'POST', url: '/v1/subscriptions', headers: s.headers, payload: { customer_id: s.customer.customer_id, plan_id: plan.json().plan_id } });
      expect(subscribed.statusCode, subscribed.body).toBe(201);
      await creditWallet(t.storage, s.walletId, usd('2'), new Date().toISOString(), 'bundle');
      expect(await s.wallet()).toMatchObject({ balance: usd('13'), cycle_credit: usd('1'), bundle_credit: usd('2') });
      expect((await verifyLedger(t.storage)).problems).toEqual([]);

      const legsOf = async (requestId: string) => {
        const tx = await t.storage.db
          .selectFrom('ledger_transactions')
          .select('id')
          .where('merchant_id', '=', s.m.merchantId)
          .where('description', '=', `Request ${requestId}`)
          .executeTakeFirstOrThrow();
        const rows = await t.storage.db
          .selectFrom('ledger_postings')
          .select(['account', 'amount'])
          .where('transaction_id', '=', tx.id)
          .where('account', 'like', 'wallet:%')
          .execute();
        return Object.fromEntries(rows.map((r) => [r.account.split(':')[2], formatMoney(BigInt(r.amount))]));
      };

      // 2.5 = cycle 1 + bundle 1.5
      expect((await s.post('bucket-1')).statusCode).toBe(201);
      expect(await s.wallet()).toMatchObject({ balance: usd('10.5'), cycle_credit: 0n, bundle_credit: usd('0.5') });
      expect(await legsOf('bucket-1')).toEqual({ cycle: '-1.0000000000', bundle: '-1.5000000000' });

      // 2.5 = bundle 0.5 + prepaid 2
      expect((await s.post('bucket-2')).statusCode).toBe(201);
      expect(await s.wallet()).toMatchObject({ balance: usd('8'), cycle_credit: 0n, bundle_credit: 0n });
      expect(await legsOf('bucket-2')).toEqual({ bundle: '-0.5000000000', prepaid: '-2.0000000000' });

      // 2.5 = prepaid only
      expect((await s.post('bucket-3')).statusCode).toBe(201);
      expect(await legsOf('bucket-3')).toEqual({ prepaid: '-2.5000000000' });
      expect((await s.wallet()).balance).toBe(usd('5.5'));
    });

    it('verifyLedger notices a bucket column that disagrees with the postings', async () => {
      const s = await setup({ fund: '3', rate: '1' });
      await t.storage.db.updateTable('wallets').set({ cycle_credit: usd('1') }).where('id', '=', s.walletId).execute();
      const { problems } = await verifyLedger(t.storage);
      expect(problems).toEqual([expect.objectContaining({ kind: 'wallet_mismatch', id: s.walletId })]);
      await t.storage.db.updateTable('wallets').set({ cycle_credit: 0n }).where('id', '=', s.walletId).execute();
    });

    it('verifyLedger notices a held total that disagrees with the active holds', async () => {
      const s = await setup({ fund: '3', rate: '1' });
      await t.storage.db.updateTable('wallets').set({ held: usd('1') }).where('id', '=', s.walletId).execute();
      expect((await verifyLedger(t.storage)).problems).toEqual([expect.objectContaining({ kind: 'held_mismatch', id: s.walletId })]);
      await t.storage.db.updateTable('wallets').set({ held: 0n }).where('id', '=', s.walletId).execute();
    });
    it('verifyLedger reports nothing while holds are placed and released under it (each wallet is compared in one snapshot)', async () => {
      const s = await setup({ fund: '3', rate: '1' });
      let moving = true;
      const churn = (async () => {
        for (let i = 0; moving; i++) {
          const hold = await placeHold(t.storage, { now: new Date(), walletId: s.walletId, amount: usd('0.1'), reference: `churn-${i}`, ttlMs: MINUTE });
          if (!('holdId' in hold)) throw new Error('hold refused');
          await releaseHold(t.storage, hold.holdId);
        }
      })();
      try {
        for (let run = 0; run < 30; run++) expect((await verifyLedger(t.storage)).problems).toEqual([]);
      } finally {
        moving = false;
        await churn;
      }
    });
  });

  describe('tollgate admin credit-wallet --bucket', () => {
    it('fills the bucket named (prepaid when none is), each credit a balanced transaction into that bucket', async () => {
      const { url } = await freshDatabase(dialect);
      const storage = openStorage(url);
      try {
        await migrateToLatest(storage);
        const { merchant } = await createMerchant(storage, { name: 'Buckets' }, new Date().toISOString());
        const credit = (amount: string, ...bucket: string[]) =>
          tollgate(['admin', 'credit-wallet', '--wallet', merchant.wallet_id, '--amount', amount, ...bucket], { DATABASE_URL: url });
        for (const [amount, bucket] of [['1', ['--bucket', 'cycle']], ['2', ['--bucket', 'bundle']], ['4', []], ['8', ['--bucket', 'prepaid']]] as const) {
          const out = await credit(amount, ...bucket);
          expect(out.code, out.stderr).toBe(0);
        }
        expect(await findWallet(storage, merchant.wallet_id)).toMatchObject({ balance: usd('15'), cycle_credit: usd('1'), bundle_credit: usd('2') });
        const postings = await storage.db
          .selectFrom('ledger_postings')
          .select(['account', 'amount'])
          .where('account', 'like', `wallet:${merchant.wallet_id}:%`)
          .execute();
        const perBucket = new Map<string, bigint>();
        for (const p of postings) {
          const { bucket } = parseWalletAccount(p.account)!;
          perBucket.set(bucket, (perBucket.get(bucket) ?? 0n) + BigInt(p.amount));
        }
        expect(Object.fromEntries(perBucket)).toEqual({ cycle: usd('1'), bundle: usd('2'), prepaid: usd('12') });
        expect((await verifyLedger(storage)).problems).toEqual([]);

        const unknown = await credit('1', '--bucket', 'savings');
        expect(unknown.code).not.toBe(0);
        expect(unknown.stderr).toContain('savings');
        expect((await findWallet(storage, merchant.wallet_id))!.balance).toBe(usd('15'));
      } finally {
        await storage.close();
      }
    }, 60_000);
  });

  describe('tollgate admin verify-ledger', () => {
    it('exits 0 on a consistent database and 1 once a wallet balance is tampered with', async () => {
      const { url } = await freshDatabase(dialect);
      const storage = openStorage(url);
      try {
        await migrateToLatest(storage);
        const { merchant } = await createMerchant(storage, { name: 'CLI' }, new Date().toISOString());
        await creditWallet(storage, merchant.wallet_id, usd('5'), new Date().toISOString());

        const clean = await tollgate(['admin', 'verify-ledger'], { DATABASE_URL: url });
        expect(clean.code, clean.stderr).toBe(0);
        expect(clean.stdout).toContain('Ledger consistent');
        expect(clean.stderr).not.toContain('checked');
        const withProgress = await tollgate(['admin', 'verify-ledger', '--progress'], { DATABASE_URL: url });
        expect(withProgress.code, withProgress.stderr).toBe(0);
        expect(withProgress.stderr).toMatch(/checked \d+ transactions, 1 wallets/);

        await storage.db
          .updateTable('wallets')
          .set({ balance: usd('6') })
          .where('id', '=', merchant.wallet_id)
          .execute();
        const tampered = await tollgate(['admin', 'verify-ledger'], { DATABASE_URL: url });
        expect(tampered.code).toBe(1);
        expect(tampered.stderr).toContain('wallet_mismatch');
        expect(tampered.stderr).toContain(merchant.wallet_id);
      } finally {
        await storage.close();
      }
    }, 60_000);
  });
});
