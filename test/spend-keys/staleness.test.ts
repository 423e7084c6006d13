import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { TestClock } from '../helpers/clock.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';

type Json = Record<string, unknown>;

/**
 * Two instances on one database: instance B holds a spend key in its credential cache (up to 2 s,
 * decision 0008) while instance A changes the key. B's very next request must follow the change,
 * because admission runs every check again on the key's locked row.
 */
describe.each(databasesUnderTest())('spend key changes made on another instance, on %s', (dialect) => {
  let upstream: MockUpstream;
  let a: TestApp;
  let b: TestApp;
  let baseB: string;
  /** Both instances' clock, so they agree on when a key expires. */
  const clock = new TestClock();

  beforeAll(async () => {
    upstream = await startMockUpstream();
    const env = {
      UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url, 'api.anthropic.com': upstream.url }),
      PROVIDER_KEYS: JSON.stringify({ openai: 'sk-openai-managed', anthropic: 'sk-ant-managed' }),
    };
    a = await startTestApp(dialect, { env, clock });
    b = await startTestApp(dialect, { env, database: a.database, clock });
    baseB = await b.listen();
    await creditWallet(a.storage, a.merchant.walletId, parseMoney('100'), dateOf(clock).toISOString());
  });
  afterAll(async () => {
    await b?.close();
    await a?.close();
    await upstream?.close();
  });

  const createKey = async (body: Json = {}) => {
    const res = await a.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: a.auth(), payload: { name: 'stale', ...body } });
    expect(res.statusCode).toBe(201);
    return res.json() as { key: string; spend_key_id: string; wallet_id: string };
  };
  const changeOnA = async (id: string, payload: Json) => {
    const res = await a.app.inject({ method: 'PATCH', url: `/v1/spend_keys/${id}`, headers: a.auth(), payload });
    expect(res.statusCode).toBe(200);
  };
  const chatOnB = (key: string, body: Json = {}) =>
    fetch(`${baseB}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }], ...body }),
    });
  const modelsOnB = (key: string) => fetch(`${baseB}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
  const errorOf = async (res: Response) => ((await res.json()) as { error: { code: string } }).error.code;

  /** B answers once with the key, so the key sits in B's credential cache for the next 2 s. */
  async function cachedOnB(key: string): Promise<void> {
    expect((await chatOnB(key)).status).toBe(200);
  }

  it('a key expired early on A is refused by B with 401 spend_key_expired', async () => {
    const key = await createKey({ expires_at: new Date(clock.now() + 3_600_000).toISOString() });
    await cachedOnB(key.key);
    await changeOnA(key.spend_key_id, { expires_at: new Date(clock.now() + 150).toISOString() });
    clock.advance(200);
    const res = await chatOnB(key.key);
    expect(res.status).toBe(401);
    expect(await errorOf(res)).toBe('spend_key_expired');
  });

  it('allow-lists and request shape narrowed on A are enforced by B at once', async () => {
    const models = await createKey();
    await cachedOnB(models.key);
    await changeOnA(models.spend_key_id, { allowed_models: ['gpt-4o-mini'] });
    const model = await chatOnB(models.key);
    expect(model.status).toBe(403);
    expect(await errorOf(model)).toBe('model_not_allowed');

    const providers = await createKey();
    await cachedOnB(providers.key);
    await changeOnA(providers.spend_key_id, { allowed_providers: ['anthropic'] });
    const provider = await chatOnB(providers.key);
    expect(provider.status).toBe(403);
    expect(await errorOf(provider)).toBe('provider_not_allowed');

    const shape = await createKey();
    await cachedOnB(shape.key);
    await changeOnA(shape.spend_key_id, { request_shape: 'anthropic' });
    const mismatch = await chatOnB(shape.key);
    expect(mismatch.status).toBe(403);
    expect(await errorOf(mismatch)).toBe('request_shape_mismatch');
  });

  it('a key paused on A is refused by B with 403, and works again once resumed', async () => {
    const key = await createKey();
    await cachedOnB(key.key);
    await changeOnA(key.spend_key_id, { status: 'paused' });
    const paused = await chatOnB(key.key);
    expect(paused.status).toBe(403);
    expect(await errorOf(paused)).toBe('spend_key_paused');
    await changeOnA(key.spend_key_id, { status: 'active' });
    expect((await chatOnB(key.key)).status).toBe(200);
  });

  it('a rate limit added on A holds on B: B asks to retry until it reads the new limit', async () => {
    const key = await createKey();
    await cachedOnB(key.key);
    await changeOnA(key.spend_key_id, { rate_limit: { rpm: 1, burst: 1 } });
    const refused = await chatOnB(key.key);
    expect(refused.status).toBe(429);
    expect(await errorOf(refused)).toBe('spend_key_rate_limited');
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    // Once B reads the key again, the new bucket decides: one token, then refusals.
    b.clock.advance(2_100);
    expect((await chatOnB(key.key)).status).toBe(200);
    expect((await chatOnB(key.key)).status).toBe(429);
  });

  it('a key revoked on A is refused by B with 401 even when its wallet is empty', async () => {
    const customer = (await a.app.inject({ method: 'POST', url: '/v1/customers', headers: a.auth(), payload: { name: 'Empty' } })).json() as Json;
    const key = await createKey({ customer_id: customer.customer_id });
    const broke = await chatOnB(key.key);
    expect(broke.status).toBe(402);
    expect(await errorOf(broke)).toBe('insufficient_balance');
    // The 402 went through B's credential cache; revoke on A and ask B again at once.
    expect((await a.app.inject({ method: 'DELETE', url: `/v1/spend_keys/${key.spend_key_id}`, headers: a.auth() })).statusCode).toBe(200);
    const revoked = await chatOnB(key.key);
    expect(revoked.status).toBe(401);
    expect(await errorOf(revoked)).toBe('unauthorized');
  });

  it('GET /v1/models on B refuses a key revoked or rotated on A at once, and follows its allow-list', async () => {
    const key = await createKey();
    expect((await modelsOnB(key.key)).status).toBe(200);
    await changeOnA(key.spend_key_id, { allowed_models: ['gpt-4o'] });
    const listed = (await (await modelsOnB(key.key)).json()) as { data: { id: string }[] };
    expect(listed.data.map((m) => m.id)).toEqual(['gpt-4o']);

    const rotated = (await a.app.inject({ method: 'POST', url: `/v1/spend_keys/${key.spend_key_id}/rotate`, headers: a.auth() })).json() as { key: string };
    expect((await modelsOnB(key.key)).status).toBe(401);
    expect((await modelsOnB(rotated.key)).status).toBe(200);
    await a.app.inject({ method: 'DELETE', url: `/v1/spend_keys/${key.spend_key_id}`, headers: a.auth() });
    const revoked = await modelsOnB(rotated.key);
    expect(revoked.status).toBe(401);
    expect(await errorOf(revoked)).toBe('unauthorized');
  });
});
