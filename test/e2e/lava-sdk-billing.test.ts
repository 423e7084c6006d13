import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

/** The published client records requests, lists them and reads usage against a running server. */
describe.each(databasesUnderTest())('published client billing calls on %s', (dialect) => {
  let t: TestApp;
  let lava: Lava;
  let customerId: string;
  let meter: { meter_id: string; meter_slug: string };

  beforeAll(async () => {
    t = await startTestApp(dialect);
    lava = new Lava(t.merchant.secretKey, { baseUrl: `${await t.listen()}/v1/` });
    const customer = await lava.customers.create({ name: 'Grace Hopper' });
    customerId = customer.customer_id;
    meter = await lava.meters.create({
      name: 'Tokens',
      rate_type: 'fixed',
      tier_type: 'tokens_1m',
      tiers: [{ start: '0', rate: '10' }],
    });
    const wallet = (customer as unknown as { wallet: { wallet_id: string } }).wallet.wallet_id;
    await creditWallet(t.storage, wallet, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => t?.close());
  checkResponsesAgainstOpenApi(() => t);

  it('creates a request whose charge is the meter fee, and retrieves it', async () => {
    // 1,500 + 500 tokens at 10 per 1M tokens = 0.02
    const created = await lava.requests.create({
      request_id: 'sdk-1',
      customer_id: customerId,
      meter_slug: meter.meter_slug,
      input_tokens: 1500,
      output_tokens: 500,
      metadata: { feature: 'chat' },
    });
    expect(created).toMatchObject({
      request_id: 'sdk-1',
      customer_id: customerId,
      meter_id: meter.meter_id,
      cost: '0.0000000000',
      charge: { amount: '0.0200000000', rate_type: 'fixed' },
      metadata: { feature: 'chat' },
    });
    expect(created.model_usage.total_tokens).toBe(2000);
    const fetched = await lava.requests.retrieve('sdk-1');
    expect(fetched).toEqual(created);
  });

  it('lists requests filtered by customer, meter and metadata', async () => {
    await lava.requests.create({
      request_id: 'sdk-2',
      customer_id: customerId,
      meter_slug: meter.meter_slug,
      input_tokens: 100,
      metadata: { feature: 'search' },
    });
    const all = await lava.requests.list({ customer_id: customerId, meter_id: meter.meter_id });
    expect(all.data.map((r) => r.request_id)).toEqual(['sdk-2', 'sdk-1']);
    const chat = await lava.requests.list({ metadata_filters: { feature: 'chat' } });
    expect(chat.data.map((r) => r.request_id)).toEqual(['sdk-1']);
    const page = await lava.requests.list({ limit: 1 });
    expect(page.has_more).toBe(true);
    const next = await lava.requests.list({ limit: 1, cursor: page.next_cursor ?? undefined });
    expect(next.data.map((r) => r.request_id)).toEqual(['sdk-1']);
  });

  it('reads daily usage with totals in both vocabularies', async () => {
    const today = new Date().toISOString().slice(0, 10);
    const usage = await lava.usage.retrieve({ start: today, customer_id: customerId });
    expect(usage.items).toHaveLength(1);
    expect(usage.items[0]).toMatchObject({ date: today, total_requests: 2, total_usage_tokens: 2100 });
    // 0.02 + 100 tokens at 10 per 1M (0.001) = 0.021
    expect(usage.totals).toMatchObject({ total_requests: 2, total_charge: '0.0210000000', total_cost: '0.0000000000' });
    const filtered = await lava.usage.retrieve({ start: today, metadata_filters: { feature: 'search' } });
    expect(filtered.totals).toMatchObject({ total_requests: 1, total_usage_tokens: 100 });
  });

  it('surfaces 402 when the wallet cannot pay, without recording', async () => {
    await expect(
      lava.requests.create({ request_id: 'sdk-big', customer_id: customerId, meter_slug: meter.meter_slug, input_tokens: 10_000_000_000 }),
    ).rejects.toThrow(/402.*insufficient_balance/);
    await expect(lava.requests.retrieve('sdk-big')).rejects.toThrow(/404/);
  });
});
