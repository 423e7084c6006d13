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
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('1'), new Date().toISOString());
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

  describe('metadata from the query parameter and the x-service-metadata header', () => {
    const post = (body: object, opts: { query?: unknown; header?: unknown } = {}) =>
      t.app.inject({
        method: 'POST',
        url: opts.query === undefined ? '/v1/requests' : `/v1/requests?metadata=${encodeURIComponent(String(opts.query))}`,
        headers: { ...t.auth(), ...(opts.header === undefined ? {} : { 'x-service-metadata': String(opts.header) }) },
        payload: body,
      });
    const base = (request_id: string) => ({ request_id, customer_id: customer.customer_id, meter_slug: meter.meter_slug });
    let funded = false;
    const fund = async () => {
      if (!funded) await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('10'), new Date().toISOString());
      funded = true;
    };

    it('merges body, query and header key by key: the body wins, then the query, then the header', async () => {
      await fund();
      const id = `meta-merge-${dialect}`;
      const res = await post(
        { ...base(id), metadata: { team: 'body' } },
        { query: JSON.stringify({ team: 'query', env: 'query' }), header: JSON.stringify({ team: 'header', env: 'header', region: 'eu' }) },
      );
      expect(res.statusCode).toBe(201);
      expect(res.json().metadata).toEqual({ team: 'body', env: 'query', region: 'eu' });
      // Stored for the filters too.
      const filters = encodeURIComponent(JSON.stringify([['region', 'eu'], ['env', 'query']]));
      const listed = await t.app.inject({ method: 'GET', url: `/v1/requests?metadata_filters=${filters}`, headers: t.auth() });
      expect(listed.json().data.map((r: { request_id: string }) => r.request_id)).toEqual([id]);
    });

    it('takes metadata from the header alone or the query alone', async () => {
      await fund();
      const fromHeader = await post(base(`meta-header-${dialect}`), { header: JSON.stringify({ source: 'header' }) });
      expect(fromHeader.statusCode).toBe(201);
      expect(fromHeader.json().metadata).toEqual({ source: 'header' });
      const fromQuery = await post(base(`meta-query-${dialect}`), { query: JSON.stringify({ source: 'query' }) });
      expect(fromQuery.statusCode).toBe(201);
      expect(fromQuery.json().metadata).toEqual({ source: 'query' });
    });

    it('replays a request_id only when the merged metadata is the same; otherwise 409', async () => {
      await fund();
      const body = base(`meta-replay-${dialect}`);
      expect((await post(body, { header: JSON.stringify({ team: 'a' }) })).statusCode).toBe(201);
      expect((await post(body, { header: JSON.stringify({ team: 'a' }) })).statusCode).toBe(200);
      // The same metadata sent in the body instead is the same request.
      expect((await post({ ...body, metadata: { team: 'a' } })).statusCode).toBe(200);
      const conflict = await post(body, { header: JSON.stringify({ team: 'b' }) });
      expect(conflict.statusCode).toBe(409);
      expect(conflict.json().error.code).toBe('request_id_conflict');
    });

    it.each([
      ['query not JSON', { query: '{team' }, ['metadata']],
      ['header not JSON', { header: 'team=a' }, ['x-service-metadata']],
      ['query an array', { query: '[["team","a"]]' }, ['metadata']],
      ['header with a non-string value', { header: '{"team":1}' }, ['x-service-metadata', 'team']],
      ['header with a bad key', { header: '{"cost-center":"x"}' }, ['x-service-metadata', 'cost-center']],
      [
        'more than 100 pairs once merged',
        {
          query: JSON.stringify(Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`q${i}`, 'v']))),
          header: JSON.stringify(Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`h${i}`, 'v']))),
        },
        ['metadata'],
      ],
    ])('refuses %s with 400 invalid_metadata, recording nothing', async (name, opts, path) => {
      await fund();
      const request_id = `meta-bad-${dialect}-${name.replace(/\W+/g, '-')}`;
      const res = await post(base(request_id), opts);
      expect(res.statusCode).toBe(400);
      const error = res.json().error;
      expect(error).toMatchObject({ code: 'invalid_metadata', status: 400 });
      expect(error.issues.map((i: { path: string[] }) => i.path)).toContainEqual(path);
      expect((await t.app.inject({ method: 'GET', url: `/v1/requests/${request_id}`, headers: t.auth() })).statusCode).toBe(404);
    });
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
