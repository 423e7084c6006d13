import { Lava } from '@lavapayments/nodejs';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS, type MockGateway } from '../helpers/gateway.ts';
import { until } from '../helpers/until.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

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
  checkResponsesAgainstOpenApi(() => g.t);

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

  it('records metadata from x-lava-metadata and X-Lava-Metadata-<Name> headers and never sends them to the provider', async () => {
    const lava = client(g.t.merchant.secretKey);
    const { customerId, meterSlug } = await g.t.customerWithMeter({ credit: '5' });
    const answer = await lava.gateway('https://api.openai.com/v1/chat/completions', {
      customer_id: customerId,
      meter_slug: meterSlug,
      headers: {
        'x-lava-metadata': JSON.stringify({ feature: 'summary', cohort: 'a' }),
        'X-Lava-Metadata-Cohort': 'b',
        'X-Lava-Metadata-User-Id': 'u42',
        'x-service-metadata': JSON.stringify({ feature: 'older', team: 'core' }),
      },
      body: { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] },
    });
    expect(answer).toMatchObject({ object: 'chat.completion' });

    const seen = g.upstream.requests.at(-1)!;
    expect(Object.keys(seen.headers).filter((name) => name.includes('metadata'))).toEqual([]);

    // The per-key header beats the JSON one; x-lava-metadata beats x-service-metadata.
    const metadata = { feature: 'summary', cohort: 'b', user_id: 'u42', team: 'core' };
    // gateway() returns only the JSON; the record is written just after the answer.
    const listed = await until(async () => {
      const page = await lava.requests.list({ customer_id: customerId, metadata_filters: { user_id: 'u42' } });
      return page.data.length > 0 && page;
    }, 'the request to be listed by its metadata');
    expect(listed.data).toHaveLength(1);
    expect(listed.data[0]!.metadata).toEqual(metadata);
  });

  it('refuses an invalid metadata header before calling the provider', async () => {
    const { customerId, meterSlug } = await g.t.customerWithMeter({ credit: '5' });
    const before = g.upstream.requests.length;
    const lava = client(g.t.merchant.secretKey);
    const call = (headers: Record<string, string>) =>
      lava.gateway('https://api.openai.com/v1/chat/completions', { customer_id: customerId, meter_slug: meterSlug, headers, body: { model: 'gpt-4o-mini', messages: [] } });
    await expect(call({ 'x-lava-metadata': '{not json' })).rejects.toThrow(/400.*invalid_metadata/);
    await expect(call({ 'X-Lava-Metadata-Plan': 'x'.repeat(256) })).rejects.toThrow(/400.*invalid_metadata.*x-lava-metadata-plan/);
    await expect(call({ 'X-Lava-Metadata-Bad.Key': 'v' })).rejects.toThrow(/400.*invalid_metadata.*x-lava-metadata-bad\.key/);
    expect(g.upstream.requests.length).toBe(before);
  });

  it('names the request in x-lava-request-id beside x-tollgate-request-id, for the OpenAI client through the forward URL', async () => {
    const lava = client(g.t.merchant.secretKey);
    const { customerId, meterSlug } = await g.t.customerWithMeter({ credit: '5' });
    const openai = new OpenAI({ apiKey: lava.generateForwardToken({ customer_id: customerId, meter_slug: meterSlug }), baseURL: lava.providers.openai });
    const { response } = await openai.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    const requestId = response.headers.get('x-lava-request-id');
    expect(requestId).toMatch(/^req_/);
    expect(response.headers.get('x-tollgate-request-id')).toBe(requestId);
    expect(await g.t.settledRecord(requestId)).toMatchObject({ request_id: requestId, customer_id: customerId, status: 'completed' });
  });
  it('takes the emails the HTML standard does, IDN domains included, on create, update and the checkout form', async () => {
    const lava = client(g.t.merchant.secretKey);
    const short = await lava.customers.create({ email: 'a@b.c' });
    expect(short.contact.email).toBe('a@b.c');
    const idn = await lava.customers.update(short.customer_id, { email: 'user@bücher.example' });
    expect(idn.contact.email).toBe('user@bücher.example');
    for (const bad of ['a@b..c', 'user@bü cher.example', '"quoted"@example.com']) {
      await expect(lava.customers.create({ email: bad })).rejects.toThrow(/^Lava API Error: 400 .*"code":"validation_error".*"path":\["email"\]/);
      await expect(lava.customers.update(short.customer_id, { email: bad })).rejects.toThrow(/^Lava API Error: 400 .*"path":\["email"\]/);
    }

    // The hosted checkout applies the same rule to the email a new customer types.
    const pay = async (email: string) => {
      const session = await lava.checkoutSessions.create({ checkout_mode: 'onboarding', origin_url: 'https://shop.example.com' } as unknown as Parameters<Lava['checkoutSessions']['create']>[0]);
      const form = new URLSearchParams({ token: session.checkout_session_token, amount: '1', email, card_number: '4242424242424242' });
      const res = await fetch(`${g.base}/checkout/pay`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: form.toString() });
      return { status: res.status, body: await res.text(), sessionId: session.checkout_session_id };
    };
    const refused = await pay('a@b..c');
    expect(refused.status).toBe(400);
    expect(refused.body).toContain('Enter a valid email address');
    const paid = await pay('user@bücher.example');
    expect(paid.status, paid.body).toBe(200);
    const customers = await lava.customers.list({ limit: 1 });
    expect(customers.data[0]!.contact.email).toBe('user@bücher.example');
  });
  it('GET /v1/requests/{id} finds every forwarded request right after its answer, by the id in x-lava-request-id', async () => {
    const lava = client(g.t.merchant.secretKey);
    // 20 calls at 0.25 each, plus the provider's cost.
    const { customerId, meterSlug } = await g.t.customerWithMeter({ credit: '10' });
    const openai = new OpenAI({ apiKey: lava.generateForwardToken({ customer_id: customerId, meter_slug: meterSlug }), baseURL: lava.providers.openai, maxRetries: 0 });
    for (let i = 0; i < 20; i++) {
      const { response } = await openai.chat.completions.create({ model: 'gpt-4o-mini', max_tokens: 5, messages: [{ role: 'user', content: `call ${i}` }] }).withResponse();
      const requestId = response.headers.get('x-lava-request-id')!;
      const record = await lava.requests.retrieve(requestId);
      expect(record.request_id).toBe(requestId);
      expect(['pending', 'completed']).toContain(record.status);
    }
  });

  it('shows a request whose answer is still streaming as pending: who, what and where known, no usage or cost yet', async () => {
    const lava = client(g.t.merchant.secretKey);
    const { customerId, meterId, meterSlug } = await g.t.customerWithMeter({ credit: '5' });
    const openai = new OpenAI({ apiKey: lava.generateForwardToken({ customer_id: customerId, meter_slug: meterSlug }), baseURL: lava.providers.openai, maxRetries: 0 });
    // The provider paces its stream, so the answer has started well before it ends.
    g.upstream.setNext({ path: '/chat/completions', chunkDelayMs: 60 });
    const { data: stream, response } = await openai.chat.completions
      .create({ model: 'gpt-4o-mini', max_tokens: 3, stream: true, messages: [{ role: 'user', content: 'count slowly' }] }, { headers: { 'X-Lava-Metadata-Step': 'streaming' } })
      .withResponse();
    const requestId = response.headers.get('x-lava-request-id')!;

    const pending = await lava.requests.retrieve(requestId);
    expect(pending).toMatchObject({
      request_id: requestId,
      status: 'pending',
      customer_id: customerId,
      meter_id: meterId,
      provider: 'openai',
      model: 'gpt-4o-mini',
      endpoint: 'POST https://api.openai.com/v1/chat/completions',
      metadata: { step: 'streaming' },
      model_usage: { input_tokens: 0, output_tokens: 0, total_cost: '0.0000000000' },
      total_request_cost: '0.0000000000',
    });

    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('tok tok tok');
    expect(await g.t.settledRecord(requestId)).toMatchObject({ status: 'completed', model_usage: { input_tokens: 2, output_tokens: 3 } });
    // Written: the process keeps no unwritten record of it any more.
    await g.t.app.gateway.settlements.drain();
    expect(g.t.app.gateway.settlements.pending.find(g.t.merchant.merchantId, requestId)).toBeUndefined();
  });
  it('POST /v1/requests reads the same metadata headers, the body winning on a shared key', async () => {
    const lava = client(g.t.merchant.secretKey);
    const { customerId, meterSlug } = await g.t.customerWithMeter({ credit: '1' });
    const res = await fetch(`${g.base}/v1/requests`, {
      method: 'POST',
      headers: { ...g.t.auth(), 'content-type': 'application/json', 'x-lava-metadata': '{"source":"header","team":"core"}', 'X-Lava-Metadata-Run-Id': 'r1' },
      body: JSON.stringify({ request_id: 'meta-headers-1', customer_id: customerId, meter_slug: meterSlug, metadata: { source: 'body' } }),
    });
    expect(res.status).toBe(201);
    expect((await lava.requests.retrieve('meta-headers-1')).metadata).toEqual({ source: 'body', team: 'core', run_id: 'r1' });
  });
});
