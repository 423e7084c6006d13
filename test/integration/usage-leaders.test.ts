import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { usageLeaders, usageReport } from '../../src/services/usage-reports.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/** The dashboard overview's top customers and models, on both engines. */
describe.each(databasesUnderTest())('usage leaders on %s', (dialect) => {
  let t: TestApp;
  const today = new Date().toISOString().slice(0, 10);

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => {
    await t?.close();
  });

  it("ranks customers by total cost with each one's GET /usage totals, and groups records by model", async () => {
    const a = await t.customerWithMeter({ credit: '50' });
    const b = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: {} })).json();
    await creditWallet(t.storage, b.wallet.wallet_id, parseMoney('50'), new Date().toISOString());
    const record = async (id: string, customer: string, extra: Record<string, unknown> = {}) => {
      const res = await t.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers: t.auth(),
        payload: { request_id: id, customer_id: customer, meter_slug: a.meterSlug, input_tokens: 100, output_tokens: 50, ...extra },
      });
      expect(res.statusCode, res.body).toBe(201);
      await t.settledRecord(id);
    };
    await record('l-1', b.customer_id, { provider: 'openai', model: 'gpt-4o-mini' });
    await record('l-2', a.customerId, { provider: 'openai', model: 'gpt-4o-mini' });
    await record('l-3', a.customerId);
    await record('l-4', a.customerId, { provider: 'openai', model: 'gpt-4o' });

    const now = new Date();
    const range = { start: today, end: today };
    const leaders = await usageLeaders(t.storage, t.merchant.merchantId, range, now, 5);
    expect(leaders.customers.map((c) => [c.key, c.total_requests])).toEqual([[a.customerId, 3], [b.customer_id, 1]]);
    for (const { key, ...totals } of leaders.customers) {
      const report = await usageReport(t.storage, t.merchant.merchantId, { ...range, customer_id: key }, now);
      expect(totals).toEqual(report.totals);
    }
    expect(Object.fromEntries(leaders.models.map((m) => [m.key, m.total_requests]))).toEqual({ 'gpt-4o-mini': 2, 'gpt-4o': 1, '': 1 });
    const everything = await usageReport(t.storage, t.merchant.merchantId, range, now);
    const modelsTotal = leaders.models.reduce((acc, m) => acc + parseMoney(m.total_request_cost), 0n);
    expect(modelsTotal).toBe(parseMoney(everything.totals.total_request_cost));
    expect(leaders.models.map((m) => parseMoney(m.total_request_cost))).toEqual(
      leaders.models.map((m) => parseMoney(m.total_request_cost)).sort((x, y) => (x > y ? -1 : x < y ? 1 : 0)),
    );

    expect(await usageLeaders(t.storage, t.merchant.merchantId, { start: '2020-01-01', end: '2020-01-02' }, now, 5)).toEqual({ customers: [], models: [] });
    const other = await t.newMerchant('Other');
    expect(await usageLeaders(t.storage, other.merchantId, range, now, 5)).toEqual({ customers: [], models: [] });
    expect((await usageLeaders(t.storage, t.merchant.merchantId, range, now, 1)).customers).toHaveLength(1);
  });

  it("keeps a customer's total exact past what a 64-bit integer holds (20 days of 90,000,000 each)", async () => {
    const merchant = await t.newMerchant('Large');
    const big = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(merchant.secretKey), payload: {} })).json();
    const small = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(merchant.secretKey), payload: {} })).json();
    const each = parseMoney('90000000');
    const dayStart = Date.parse(`${today}T00:00:00.000Z`);
    const sums = (cost: bigint) => ({ requests: 1n, tokens: 0n, usage_cost: cost, fee: 0n, service_charge: 0n, request_cost: cost, wallet_cost: cost, merchant_cost: 0n });
    const at = (i: number) => new Date(dayStart - i * 86_400_000).toISOString();
    // The overview's leaders read whole UTC days from the daily rollup; GET /usage for one
    // customer reads the same sums from the 15-minute rollup at its grain.
    await t.storage.db
      .insertInto('usage_rollups_by_day')
      .values([
        ...Array.from({ length: 20 }, (_, i) => ({ merchant_id: merchant.merchantId, dimension: 'customer' as const, day_start: at(i), key: big.customer_id, ...sums(each) })),
        { merchant_id: merchant.merchantId, dimension: 'customer' as const, day_start: at(0), key: small.customer_id, ...sums(parseMoney('1')) },
      ])
      .execute();
    await t.storage.db
      .insertInto('usage_rollups_grouped')
      .values(Array.from({ length: 20 }, (_, i) => ({ merchant_id: merchant.merchantId, dimension: 'customer' as const, key: big.customer_id, value: '', bucket_start: at(i), ...sums(each) })))
      .execute();
    const range = { start: at(19).slice(0, 10), end: today };
    const leaders = await usageLeaders(t.storage, merchant.merchantId, range, new Date(), 5);
    expect(2n ** 63n).toBeLessThan(each * 20n);
    expect(leaders.customers.map((c) => [c.key, c.total_request_cost, c.total_requests])).toEqual([
      [big.customer_id, '1800000000.0000000000', 20],
      [small.customer_id, '1.0000000000', 1],
    ]);
    const report = await usageReport(t.storage, merchant.merchantId, { ...range, customer_id: big.customer_id }, new Date());
    expect(report.totals.total_request_cost).toBe('1800000000.0000000000');
  });
});
