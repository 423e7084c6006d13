import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * Money must hold under concurrency: a wallet that can pay for exactly 50 requests pays for
 * exactly 50, however many arrive at once and however many instances serve them.
 */
describe.each(databasesUnderTest())('concurrent request recording on %s', (dialect) => {
  let first: TestApp;
  let second: TestApp;
  let urls: string[];

  beforeAll(async () => {
    first = await startTestApp(dialect);
    second = await startTestApp(dialect, { database: first.database });
    urls = [await first.listen(), await second.listen()];
  });
  afterAll(async () => {
    await second?.close();
    await first?.close();
  });

  async function payableCustomer(requestsItCanPay: number) {
    const m = await first.newMerchant();
    const headers = { ...first.auth(m.secretKey), 'content-type': 'application/json' };
    const post = async (path: string, body: object) =>
      (await fetch(`${urls[0]}/v1${path}`, { method: 'POST', headers, body: JSON.stringify(body) })).json();
    const customer = await post('/customers', { name: 'Load' });
    const meter = await post('/meters', {
      name: 'Per request',
      rate_type: 'fixed',
      tier_type: 'requests',
      tiers: [{ start: '0', rate: '0.02' }],
    });
    await creditWallet(first.storage, customer.wallet.wallet_id, parseMoney('0.02') * BigInt(requestsItCanPay), new Date().toISOString());
    return { headers, customer, meter };
  }

  async function fire(headers: Record<string, string>, bodies: object[]) {
    return Promise.all(
      bodies.map(async (body, i) => {
        const res = await fetch(`${urls[i % urls.length]}/v1/requests`, { method: 'POST', headers, body: JSON.stringify(body) });
        return { status: res.status, body: (await res.json()) as { error?: { code: string } } };
      }),
    );
  }

  it('admits exactly as many requests as the wallet can pay, across two instances', async () => {
    const { headers, customer, meter } = await payableCustomer(50);
    const bodies = Array.from({ length: 200 }, (_, i) => ({
      request_id: `load-${i}`,
      customer_id: customer.customer_id,
      meter_slug: meter.meter_slug,
    }));
    const results = await fire(headers, bodies);
    const created = results.filter((r) => r.status === 201).length;
    const refused = results.filter((r) => r.status === 402);
    expect(created).toBe(50);
    expect(refused.length).toBe(150);
    expect(refused.every((r) => r.body.error?.code === 'insufficient_balance')).toBe(true);
    expect((await findWallet(first.storage, customer.wallet.wallet_id))?.balance).toBe(0n);

    const list = await fetch(`${urls[1]}/v1/customers/${customer.customer_id}`, { headers });
    expect(((await list.json()) as { wallet: { balance: string } }).wallet.balance).toBe('0.0000000000');
    expect((await verifyLedger(first.storage)).problems).toEqual([]);
  });

  it('records one request for many concurrent copies of the same request_id', async () => {
    const { headers, customer, meter } = await payableCustomer(10);
    const body = { request_id: 'same-id', customer_id: customer.customer_id, meter_slug: meter.meter_slug };
    const results = await fire(headers, Array.from({ length: 50 }, () => body));
    expect(results.filter((r) => r.status === 201).length).toBe(1);
    expect(results.filter((r) => r.status === 200).length).toBe(49);
    expect((await findWallet(first.storage, customer.wallet.wallet_id))?.balance).toBe(parseMoney('0.18'));
    expect((await verifyLedger(first.storage)).problems).toEqual([]);
  });
});
