import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { useSignedInDashboard, tableValues } from '../helpers/dashboard.ts';

/**
 * The overview's top customers and top models in real Chromium: every row is the number the API
 * gives for the same days (GET /v1/usage filtered by the customer; the records of GET /v1/requests
 * for a model), and the ranking follows the total request cost.
 */
describe('dashboard overview leaders (Chromium)', () => {
  const d = useSignedInDashboard('leaders@shop.example');
  const today = new Date().toISOString().slice(0, 10);

  it('says how to record a first request while the log is empty, and tells an empty filter apart', async () => {
    await d.visit('/dashboard/requests', 'requests-empty');
    const text = await d.page.textContent('main');
    expect(text).toContain('No requests yet');
    expect(text).toContain('POST $TOLLGATE/v1/requests');
    await d.page.goto(`${d.base}/dashboard/requests?status=error`);
    expect(await d.page.textContent('main')).toContain('No requests match');
    expect(await d.page.textContent('main')).not.toContain('POST $TOLLGATE/v1/requests');
  });

  it('ranks customers and models by total cost, with the numbers of GET /v1/usage and GET /v1/requests', async () => {
    const big = await d.t.customerWithMeter({ credit: '100', secretKey: d.secretKey });
    const small = (await d.api('POST', '/v1/customers', {})).body;
    await creditWallet(d.t.storage, small.wallet.wallet_id, parseMoney('100'), new Date().toISOString());
    const record = async (id: string, customer: string, extra: Record<string, unknown>) => {
      const res = await d.api('POST', '/v1/requests', { request_id: id, customer_id: customer, meter_slug: big.meterSlug, ...extra });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      await d.t.settledRecord(id, d.t.auth(d.secretKey));
    };
    const gpt = { provider: 'openai', model: 'gpt-4o-mini' };
    await record('lead-1', big.customerId, { ...gpt, input_tokens: 2000, output_tokens: 1000 });
    await record('lead-2', big.customerId, { ...gpt, input_tokens: 500, output_tokens: 100 });
    await record('lead-3', small.customer_id, { input_tokens: 10, output_tokens: 5 });

    await d.visit(`/dashboard?start=${today}&end=${today}&tz=%2B00:00`, 'overview-leaders');
    const customers = await tableValues(d.page, '#top-customers');
    const customerIds = await d.page.$$eval('#top-customers tbody th a', (links) => links.map((a) => a.getAttribute('title')));
    expect(customerIds).toEqual([big.customerId, small.customer_id]);
    for (const [i, [, requests, tokens, fee, total]] of customers.entries()) {
      const customerId = customerIds[i]!;
      const usage = (await d.api('GET', `/v1/usage?start=${today}&end=${today}&customer_id=${customerId}`)).body.totals;
      expect([requests, tokens, fee, total]).toEqual([
        usage.total_requests.toLocaleString('en-US'),
        usage.total_usage_tokens.toLocaleString('en-US'),
        usage.total_fee_amount,
        usage.total_request_cost,
      ]);
    }

    const models = await tableValues(d.page, '#top-models');
    const records = (await d.api('GET', '/v1/requests?limit=100')).body.data as { model: string | null; total_request_cost: string; fee: { amount: string } }[];
    const expected = new Map<string, { requests: number; fee: bigint; total: bigint }>();
    for (const r of records) {
      const key = r.model ?? 'no model given';
      const sum = expected.get(key) ?? { requests: 0, fee: 0n, total: 0n };
      expected.set(key, { requests: sum.requests + 1, fee: sum.fee + parseMoney(r.fee.amount), total: sum.total + parseMoney(r.total_request_cost) });
    }
    expect(models.map((r) => r[0])).toEqual(['gpt-4o-mini', 'no model given']);
    for (const [model, requests, , fee, total] of models) {
      const sum = expected.get(model!)!;
      expect([Number(requests), parseMoney(fee!), parseMoney(total!)]).toEqual([sum.requests, sum.fee, sum.total]);
    }

    // The customer link opens that customer's page.
    expect(await d.page.getAttribute('#top-customers tbody tr:first-child a', 'href')).toBe(`/dashboard/customers/${big.customerId}`);

    // The request log names the customer the same way: a link to its page, the id on hover.
    await d.visit('/dashboard/requests', 'requests-named');
    const link = d.page.locator('tr', { hasText: 'lead-1' }).locator(`a[href="/dashboard/customers/${big.customerId}"]`);
    expect(await link.getAttribute('title')).toBe(big.customerId);
  });

  it('shows no leaders for a range without requests', async () => {
    await d.visit('/dashboard?start=2020-01-01&end=2020-01-02&tz=%2B00:00', 'overview-range-empty');
    expect(await d.page.locator('#top-customers').count()).toBe(0);
    expect(await d.page.textContent('main')).toContain('No requests in this range yet');
  });
});
