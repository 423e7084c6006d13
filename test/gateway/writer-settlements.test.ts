import { describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { GroupCommitWriter } from '../../src/ledger/group-commit.ts';
import { ADMIT_JOB, admitRequest } from '../../src/ledger/admission/admit.ts';
import { failRequest, SETTLE_JOB, settleRequest, type SettleInput } from '../../src/ledger/settlement/settle.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, useTestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { admissionOf, settlementOf, tokenUsage } from '../helpers/settle.ts';

/**
 * The gateway's group-commit writer settling real requests: a batch charges each member once (a
 * duplicate nothing), in one transaction, taking tier positions in order; a request counts on its
 * admission day; the hold sweeper fails expired requests batch after batch.
 */

describe.each(databasesUnderTest())('gateway writer on %s', (dialect) => {
  const t = useTestApp(dialect);

  it('a batch of settlements with a duplicate member: the others settle, the duplicate charges nothing', async () => {
    const { merchant, secretKey } = await t.newMerchant('Batch').then((m) => ({ merchant: m, secretKey: m.secretKey }));
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'), new Date().toISOString());
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
    await creditWallet(t.storage, merchant.walletId, parseMoney('100'), new Date().toISOString());
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
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('5'), new Date().toISOString());
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
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'), new Date().toISOString());
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
    await failRequest(t.storage, { now: new Date(), recordId: failed.recordId, holdIds: failed.holdIds });

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
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'), new Date().toISOString());
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
});
