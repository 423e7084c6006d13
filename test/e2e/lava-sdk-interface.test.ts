import { Lava } from '@lavapayments/nodejs';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS, type MockGateway } from '../helpers/gateway.ts';

/**
 * Where the published client (`@lavapayments/nodejs` 11.2) and the documented interface expect
 * something of the server beyond the resources themselves: strict updates, the public model list,
 * and the values Tollgate adds to the interface's enums.
 */
describe.each(databasesUnderTest())('published Lava client: interface fidelity on %s', (dialect) => {
  let g: MockGateway;
  const client = (key: string) => new Lava(key, { baseUrl: `${g.base}/v1/` });

  beforeAll(async () => {
    g = await startGatewayOnMock(dialect, THREE_PROVIDERS);
  });
  afterAll(async () => {
    await g?.t.close();
    await g?.upstream.close();
  });

  it('refuses a meter update naming a field an update cannot change, and changes nothing', async () => {
    const lava = client(g.t.merchant.secretKey);
    const meter = await lava.meters.create({ name: 'Strict', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '1' }] });
    const update = lava.meters.update(meter.meter_id, { name: 'Renamed', rate_type: 'percentage' } as Parameters<Lava['meters']['update']>[1]);
    await expect(update).rejects.toThrow(/^Lava API Error: 400 .*"code":"validation_error".*"issues":\[\{"path":\["rate_type"\],"message":"is not a known field"\}\]/);
    expect(await lava.meters.retrieve(meter.meter_id)).toEqual(meter);
    // The fields an update may change still work.
    expect(await lava.meters.update(meter.meter_id, { name: 'Renamed' })).toMatchObject({ name: 'Renamed', rate_type: 'fixed' });
  });

  it('serves GET /v1/models without a key, as the client lists them with one', async () => {
    const withKey = await client(g.t.merchant.secretKey).models.list();
    expect(withKey.object).toBe('list');
    expect(withKey.data.length).toBeGreaterThan(0);

    const open = await fetch(`${g.base}/v1/models`);
    expect(open.status).toBe(200);
    expect(await open.json()).toEqual(withKey);

    // The OpenAI client with no usable key reads the same list and one model of it.
    const openai = new OpenAI({ apiKey: 'unused', baseURL: `${g.base}/v1`, defaultHeaders: { authorization: null } });
    const ids = [];
    for await (const model of openai.models.list()) ids.push(model.id);
    expect(ids).toEqual(withKey.data.map((m) => m.id));
    expect(await openai.models.retrieve(ids[0]!)).toEqual(withKey.data[0]);

    // A key that is sent must still be a valid one.
    await expect(client('sk_live_not_a_key').models.list()).rejects.toThrow(/^Lava API Error: 401 /);
  });

  it('marks the subscription states and changes the client does not know as extensions in the OpenAPI document', async () => {
    const doc = (await (await fetch(`${g.base}/v1/openapi.json`)).json()) as { paths: Record<string, Record<string, unknown>> };
    const list = JSON.stringify(doc.paths['/v1/subscriptions']!.get);
    expect(list).toMatch(/"enum":\["active","past_due","cancelled"\],"description":"`past_due` is Tollgate's extension/);
    expect(list).toMatch(/"enum":\["cancellation","downgrade","upgrade"\],"description":"`upgrade` is Tollgate's extension/);
    const customer = JSON.stringify(doc.paths['/v1/customers/{id}']!.get);
    expect(customer).toMatch(/"enum":\["active","past_due"\],"description":"`past_due` is Tollgate's extension/);
  });
});
