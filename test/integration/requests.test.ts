import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('POST /v1/requests on %s', (dialect) => {
  let t: TestApp;
  let customer: { customer_id: string; connection_secret: string; wallet: { wallet_id: string } };
  let meter: { meter_slug: string; product_secret: string; meter_id: string };

  beforeAll(async () => {
    t = await startTestApp(dialect);
    const h = t.auth();
    customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: { name: 'Ada' } })).json();
    meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'Per request', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: '0', rate: '0.25' }] },
      })
    ).json();
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('1'));
  });
  afterAll(async () => t?.close());

  const record = (body: object) => t.app.inject({ method: 'POST', url: '/v1/requests', headers: t.auth(), payload: body });

  it('charges the fee to the customer wallet and refuses with 402 once it cannot pay', async () => {
    const ids = ['a', 'b', 'c', 'd', 'e'].map((s) => `req-${dialect}-${s}`);
    const statuses: number[] = [];
    for (const request_id of ids) {
      const res = await record({ request_id, customer_id: customer.customer_id, meter_slug: meter.meter_slug });
      statuses.push(res.statusCode);
      if (res.statusCode === 201) {
        expect(res.json()).toMatchObject({
          request_id,
          status: 'completed',
          customer_id: customer.customer_id,
          connection_id: customer.customer_id,
          meter_id: meter.meter_id,
          product_id: meter.meter_id,
          fee: { amount: '0.2500000000', rate_type: 'fixed' },
          charge: { amount: '0.2500000000' },
          total_request_cost: '0.2500000000',
          total_wallet_cost: '0.2500000000',
          total_merchant_cost: '0.0000000000',
        });
      } else {
        expect(res.json().error.code).toBe('insufficient_balance');
      }
    }
    expect(statuses).toEqual([201, 201, 201, 201, 402]);
    const after = await t.app.inject({ method: 'GET', url: `/v1/customers/${customer.customer_id}`, headers: t.auth() });
    expect(after.json().wallet.balance).toBe('0.0000000000');
    const refused = await t.app.inject({ method: 'GET', url: `/v1/requests/${ids[4]}`, headers: t.auth() });
    expect(refused.statusCode).toBe(404);
  });

  it('documents provider_key_type as managed or unmanaged, the only values anything records', async () => {
    const doc = (await t.app.inject({ method: 'GET', url: '/v1/openapi.json' })).json();
    const record = doc.paths['/v1/requests/{id}'].get.responses['200'].content['application/json'].schema;
    expect(record.properties.provider_key_type.enum).toEqual(['managed', 'unmanaged']);
  });

  it('replays the same request_id with 200 and refuses a different body with 409', async () => {
    const m = await t.newMerchant();
    const h = t.auth(m.secretKey);
    const c = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: {} })).json();
    const body = { request_id: 'dup-1', connection_secret: c.connection_secret, product_secret: meter.product_secret };
    // The meter belongs to another merchant: its secret is unknown here.
    const foreign = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: h, payload: body });
    expect(foreign.statusCode).toBe(404);

    const own = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'Free', rate_type: 'fixed', tiers: [{ start: '0', rate: '0' }] },
      })
    ).json();
    const ok = { ...body, product_secret: own.product_secret, input_tokens: 10 };
    const first = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: h, payload: ok });
    expect(first.statusCode).toBe(201);
    const again = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: h, payload: ok });
    expect(again.statusCode).toBe(200);
    expect(again.json()).toEqual(first.json());
    const changed = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: h, payload: { ...ok, input_tokens: 11 } });
    expect(changed.statusCode).toBe(409);
    expect(changed.json().error.code).toBe('request_id_conflict');
  });
});
