import { createServer, type AddressInfo, type Server } from 'node:net';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

type Json = Record<string, unknown>;

/** Spend keys used as drop-in provider keys: official clients, every refusal with its own code, exact counters. */
describe.each(databasesUnderTest())('spend key enforcement on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com', 'api.anthropic.com', 'api.mistral.ai'],
      providerKeys: { openai: 'sk-openai-managed', anthropic: 'sk-ant-managed', mistral: 'mistral-managed' },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('50'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const createKey = async (body: Json = {}) => {
    const res = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'k', ...body } });
    expect(res.statusCode).toBe(201);
    const json = res.json() as Json & { key: string; spend_key_id: string };
    return json;
  };
  const retrieve = async (id: string) =>
    (await t.app.inject({ method: 'GET', url: `/v1/spend_keys/${id}`, headers: t.auth() })).json() as Json;
  const chat = (key: string, body: Json = {}) =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'hello there' }], ...body }),
    });
  const codeOf = async (res: Response) => ((await res.json()) as { error: { code: string } }).error.code;

  /** Settlement runs after the answer: wait until the key has no request in flight. */
  function settled(id: string, requests: number): Promise<Json> {
    return until(async () => {
      // Reservations first: once none is left, the key read after them shows every settlement.
      const inFlight = await t.storage.db.selectFrom('spend_key_reservations').select('request_pk').where('spend_key_id', '=', id).execute();
      const key = await retrieve(id);
      return key.total_requests === requests && inFlight.length === 0 && key;
    }, `the key to settle ${requests} requests`);
  }

  it('completes a chat completion through the openai client and counts spend and requests exactly', async () => {
    const key = await createKey({ allowed_models: ['gpt-4o'], spend_limit: { amount: '5', cycle: 'daily' } });
    const openai = new OpenAI({ apiKey: key.key, baseURL: `${base}/v1` });
    const completion = await openai.chat.completions.create({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'hello there' }] });
    expect(completion.usage?.completion_tokens).toBe(4);
    expect(upstream.requests.at(-1)!.headers.authorization).toBe('Bearer sk-openai-managed');
    await openai.chat.completions.create({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'again' }] });

    const after = await settled(key.spend_key_id, 2);
    const records = (await t.app.inject({ method: 'GET', url: '/v1/requests?limit=2', headers: t.auth() })).json().data as Json[];
    const cost = records.reduce((sum, r) => sum + parseMoney(r.total_merchant_cost as string) + parseMoney(r.total_wallet_cost as string), 0n);
    expect(cost).toBeGreaterThan(0n);
    expect(parseMoney(after.current_spend as string)).toBe(cost);
    expect(parseMoney(after.total_spend as string)).toBe(cost);
    expect(after).toMatchObject({ current_requests: 2, total_requests: 2 });
    expect(after.last_used_at).not.toBeNull();
  });

  it('serves the anthropic client with an anthropic-shaped key, and refuses each key on the other shape', async () => {
    const key = await createKey({ request_shape: 'anthropic' });
    const anthropic = new Anthropic({ apiKey: key.key, baseURL: base });
    const message = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 6, messages: [{ role: 'user', content: 'one two' }] });
    expect(message.usage.output_tokens).toBe(6);
    expect(JSON.stringify(upstream.requests.at(-1)!.headers)).not.toContain(key.key);

    const wrong = await chat(key.key);
    expect(wrong.status).toBe(403);
    expect(await codeOf(wrong)).toBe('request_shape_mismatch');
    const openaiKey = await createKey();
    const viaMessages = await fetch(`${base}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': openaiKey.key, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'x' }] }),
    });
    expect(viaMessages.status).toBe(403);
  });

  it('refuses models and providers outside the allow-lists with 403, and lists only allowed models', async () => {
    const key = await createKey({ allowed_models: ['gpt-4o', 'mistral/mistral-large-latest'], allowed_providers: ['openai', 'mistral'] });
    expect((await chat(key.key, { model: 'gpt-4o-mini' })).status).toBe(403);
    expect(await codeOf(await chat(key.key, { model: 'gpt-4o-mini' }))).toBe('model_not_allowed');
    expect((await chat(key.key, { model: 'mistral/mistral-large-latest' })).status).toBe(200);
    const providerKey = await createKey({ allowed_providers: ['mistral'] });
    const refused = await chat(providerKey.key);
    expect(refused.status).toBe(403);
    expect(await codeOf(refused)).toBe('provider_not_allowed');

    const openai = new OpenAI({ apiKey: key.key, baseURL: `${base}/v1` });
    const ids: string[] = [];
    for await (const model of openai.models.list()) ids.push(model.id);
    expect(ids.sort()).toEqual(['gpt-4o', 'mistral/mistral-large-latest'].filter((id) => ids.includes(id)).sort());
    expect(ids).toContain('gpt-4o');
    expect(ids.some((id) => id.startsWith('anthropic/'))).toBe(false);
  });

  it('refuses paused (403), revoked, rotated-away and unknown keys (401) on the very next request', async () => {
    const key = await createKey();
    expect((await chat(key.key)).status).toBe(200);
    await t.app.inject({ method: 'PUT', url: `/v1/spend_keys/${key.spend_key_id}`, headers: t.auth(), payload: { status: 'paused' } });
    const paused = await chat(key.key);
    expect(paused.status).toBe(403);
    expect(await codeOf(paused)).toBe('spend_key_paused');
    await t.app.inject({ method: 'PATCH', url: `/v1/spend_keys/${key.spend_key_id}`, headers: t.auth(), payload: { status: 'active' } });

    const rotated = (await t.app.inject({ method: 'POST', url: `/v1/spend_keys/${key.spend_key_id}/rotate`, headers: t.auth() })).json() as { key: string };
    expect((await chat(key.key)).status).toBe(401);
    expect((await chat(rotated.key)).status).toBe(200);
    await t.app.inject({ method: 'DELETE', url: `/v1/spend_keys/${key.spend_key_id}`, headers: t.auth() });
    const revoked = await chat(rotated.key);
    expect(revoked.status).toBe(401);
    expect(await codeOf(revoked)).toBe('unauthorized');
    expect((await chat('spk_live_unknown')).status).toBe(401);
  });

  it('refuses an expired key with 401 spend_key_expired', async () => {
    const key = await createKey({ expires_at: new Date(t.clock.now() + 400).toISOString() });
    expect((await chat(key.key)).status).toBe(200);
    t.clock.advance(450);
    const expired = await chat(key.key);
    expect(expired.status).toBe(401);
    expect(await codeOf(expired)).toBe('spend_key_expired');
  });

  it('enforces the request limit with 429 (a reset hours away told as a time, not a Retry-After), and emits spend_key.limit_reached once per cycle', async () => {
    // Two minutes past midnight UTC, so the daily cycle resets almost a day away.
    const day = 86_400_000;
    t.clock.advance(day - (t.clock.now() % day) + 120_000);
    const key = await createKey({ request_limit: { count: 2, cycle: 'daily' } });
    expect((await chat(key.key)).status).toBe(200);
    expect((await chat(key.key)).status).toBe(200);
    for (let i = 0; i < 2; i++) {
      const refused = await chat(key.key);
      expect(refused.status).toBe(429);
      expect(await codeOf(refused)).toBe('request_limit_reached');
      expect(refused.headers.get('retry-after')).toBeNull();
      expect(refused.headers.get('x-should-retry')).toBe('false');
      const nextMidnight = Math.ceil(t.clock.now() / day) * day;
      expect(Number(refused.headers.get('x-ratelimit-reset'))).toBe(nextMidnight / 1000);
    }
    const events = await t.storage.db.selectFrom('events').selectAll().where('type', '=', 'spend_key.limit_reached').execute();
    const mine = events.filter((e) => (JSON.parse(e.payload) as Json).spend_key_id === key.spend_key_id);
    expect(mine).toHaveLength(1);
    expect(JSON.parse(mine[0]!.payload)).toMatchObject({ limit: 'requests', cycle: 'daily', request_limit: 2 });
  });

  it('enforces the spend limit with 402 once the next hold cannot fit', async () => {
    // gpt-4o output costs 0.00001 per token: a 1000-token cap holds a little over 0.01.
    const key = await createKey({ spend_limit: { amount: '0.025', cycle: 'total' } });
    expect((await chat(key.key, { max_tokens: 1000 })).status).toBe(200);
    expect((await chat(key.key, { max_tokens: 1000 })).status).toBe(200);
    const refused = await chat(key.key, { max_tokens: 1000 });
    expect(refused.status).toBe(402);
    expect(await codeOf(refused)).toBe('spend_limit_reached');
    const after = await settled(key.spend_key_id, 2);
    expect(parseMoney(after.current_spend as string)).toBeLessThanOrEqual(parseMoney('0.025'));
  });

  it('a spend key whose settled charge exceeded its reservation still admits while its limit and wallet can pay what its requests in flight may overrun: no false 402 (decision 0025)', async () => {
    // A limit far above what these requests cost: only the overrun rule could refuse.
    const key = await createKey({ spend_limit: { amount: '10', cycle: 'daily' } });
    const reservations = async () =>
      (await t.storage.db.selectFrom('spend_key_reservations').select('amount').where('spend_key_id', '=', key.spend_key_id).execute()).length;
    const overrun = async () =>
      Number((await t.storage.db.selectFrom('spend_keys').select('overrun').where('id', '=', key.spend_key_id).executeTakeFirstOrThrow()).overrun);

    let answerSlow!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answerSlow = resolve)) });
    upstream.setNext({ path: '/chat/completions', overReport: 40 });
    const slow = chat(key.key);
    try {
      // A request in flight (reserved), then one the provider bills 40 times over.
      await until(async () => (await reservations()) === 1, 'one reservation');
      const over = await chat(key.key);
      expect(over.status).toBe(200);
      await over.arrayBuffer();
      await until(async () => (await reservations()) === 1 && (await overrun()) > 1_000, 'one reservation and the overrun recorded');
      const spent = await retrieve(key.spend_key_id);
      expect(parseMoney(spent.current_spend as string)).toBeGreaterThan(0n);

      // The slow one may overrun too, but the key's limit and its wallet (overrun too) can pay for
      // that: the next request is admitted (reservations.test.ts proves the key's own bound).
      const during = await chat(key.key);
      expect(during.status).toBe(200);
      await during.arrayBuffer();
      await until(async () => (await reservations()) === 1, 'one reservation');

      answerSlow();
      expect((await slow).status).toBe(200);
      await until(async () => (await reservations()) === 0, 'no reservation');
      // Nothing in flight any more: admitted again, and the overrun is over.
      const ok = await chat(key.key);
      expect(ok.status).toBe(200);
      await ok.arrayBuffer();
      expect(await overrun()).toBe(0);
      const wallet = await t.storage.db.selectFrom('wallets').select('overrun').where('id', '=', t.merchant.walletId).executeTakeFirstOrThrow();
      expect(Number(wallet.overrun)).toBe(0);
      await settled(key.spend_key_id, 4);
    } finally {
      answerSlow();
      await slow.catch(() => undefined);
    }
  });

  const limitEvents = async (keyId: string) =>
    (await t.storage.db.selectFrom('events').selectAll().where('type', '=', 'spend_key.limit_reached').execute())
      .map((e) => JSON.parse(e.payload) as Json)
      .filter((payload) => payload.spend_key_id === keyId);

  it('emits spend_key.limit_reached once on the first spend-limit refusal, though the settled spend is below the limit', async () => {
    const key = await createKey({ spend_limit: { amount: '0.025', cycle: 'daily' } });
    expect((await chat(key.key, { max_tokens: 1000 })).status).toBe(200);
    expect((await chat(key.key, { max_tokens: 1000 })).status).toBe(200);
    await settled(key.spend_key_id, 2);
    expect(await limitEvents(key.spend_key_id)).toHaveLength(0);
    for (let i = 0; i < 2; i++) expect((await chat(key.key, { max_tokens: 1000 })).status).toBe(402);

    const events = await limitEvents(key.spend_key_id);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ limit: 'spend', cycle: 'daily', spend_limit: '0.0250000000' });
    expect(parseMoney(events[0]!.current_spend as string)).toBeLessThan(parseMoney('0.025'));
  });

  it('a limit added to a key that had none counts what the key already used in the cycle', async () => {
    const key = await createKey();
    expect((await chat(key.key)).status).toBe(200);
    expect((await chat(key.key)).status).toBe(200);
    const before = await settled(key.spend_key_id, 2);
    expect(parseMoney(before.current_spend as string)).toBeGreaterThan(0n);

    const patched = await t.app.inject({
      method: 'PATCH',
      url: `/v1/spend_keys/${key.spend_key_id}`,
      headers: t.auth(),
      payload: { spend_limit: { amount: '5', cycle: 'daily' }, request_limit: { count: 3, cycle: 'daily' } },
    });
    expect(patched.json()).toMatchObject({ current_spend: before.total_spend, current_requests: 2, total_requests: 2 });
    expect((await chat(key.key)).status).toBe(200);
    const refused = await chat(key.key);
    expect(refused.status).toBe(429);
    expect(await codeOf(refused)).toBe('request_limit_reached');
  });

  it('a limit added to a key not used since its cycle began starts from 0', async () => {
    const key = await createKey();
    expect((await chat(key.key)).status).toBe(200);
    await settled(key.spend_key_id, 1);
    const yesterday = new Date(t.clock.now() - 86_400_000).toISOString();
    await t.storage.db.updateTable('spend_keys').set({ last_used_at: yesterday }).where('id', '=', key.spend_key_id).execute();
    const patched = await t.app.inject({
      method: 'PATCH',
      url: `/v1/spend_keys/${key.spend_key_id}`,
      headers: t.auth(),
      payload: { spend_limit: { amount: '5', cycle: 'daily' }, request_limit: { count: 3, cycle: 'daily' } },
    });
    expect(patched.json()).toMatchObject({ current_spend: '0.0000000000', current_requests: 0, total_requests: 1 });
  });

  it('daily counters start again when the UTC day changes, and the limit counts only the new day', async () => {
    const key = await createKey({ spend_limit: { amount: '5', cycle: 'daily' }, request_limit: { count: 1, cycle: 'daily' } });
    expect((await chat(key.key)).status).toBe(200);
    expect((await chat(key.key)).status).toBe(429);
    const first = await settled(key.spend_key_id, 1);
    expect(first).toMatchObject({ current_requests: 1 });
    expect(await limitEvents(key.spend_key_id)).toHaveLength(1);

    // As if the counters were last written yesterday (UTC).
    const yesterday = new Date(t.clock.now() - 86_400_000);
    const start = new Date(Date.UTC(yesterday.getUTCFullYear(), yesterday.getUTCMonth(), yesterday.getUTCDate())).toISOString();
    await t.storage.db
      .updateTable('spend_keys')
      .set({ spend_cycle_start: start, request_cycle_start: start, request_event_cycle: start, spend_event_cycle: start })
      .where('id', '=', key.spend_key_id)
      .execute();
    expect(await retrieve(key.spend_key_id)).toMatchObject({ current_spend: '0.0000000000', current_requests: 0, total_requests: 1, total_spend: first.total_spend });

    expect((await chat(key.key)).status).toBe(200);
    expect((await chat(key.key)).status).toBe(429);
    const second = await settled(key.spend_key_id, 2);
    expect(second).toMatchObject({ current_requests: 1, total_requests: 2 });
    const secondCost = parseMoney(second.total_spend as string) - parseMoney(first.total_spend as string);
    expect(parseMoney(second.current_spend as string)).toBe(secondCost);
    // The new day's limit is reached anew: a second event, for the new cycle.
    const events = await limitEvents(key.spend_key_id);
    expect(events).toHaveLength(2);
    const today = new Date(t.clock.now());
    expect(events.map((e) => e.cycle_start)).toContain(new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate())).toISOString());
  });

  it("a spend-limited key's reservation covers a prompt with more tokens than the 4-characters-per-token estimate", async () => {
    const key = await createKey({ spend_limit: { amount: '5', cycle: 'daily' } });
    // The mock bills a token per word: 3000 one-letter words are 3000 tokens in 6000 characters.
    const res = await chat(key.key, { max_tokens: 1, messages: [{ role: 'user', content: 'a '.repeat(3000) }] });
    expect(res.status).toBe(200);
    const recordId = res.headers.get('x-tollgate-request-id')!;
    await settled(key.spend_key_id, 1);
    const record = await t.storage.db.selectFrom('requests').selectAll().where('id', '=', recordId).executeTakeFirstOrThrow();
    expect(Number(record.input_tokens)).toBe(3000);
    const holds = await t.storage.db.selectFrom('holds').select('amount').where('reference', '=', recordId).execute();
    const reserved = holds.reduce((sum, h) => sum + BigInt(h.amount), 0n);
    expect(BigInt(record.total_wallet_cost) + BigInt(record.total_merchant_cost)).toBeLessThanOrEqual(reserved);
  });

  it('inline media does not count as prompt bytes in the reservation', async () => {
    // 400 KB of base64 would hold about 1.0 as text tokens; the limit is a hundredth of that.
    const key = await createKey({ spend_limit: { amount: '0.01', cycle: 'daily' } });
    const image = `data:image/png;base64,${'A'.repeat(400_000)}`;
    const res = await chat(key.key, {
      max_tokens: 1,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'what is this' }, { type: 'image_url', image_url: { url: image } }] }],
    });
    expect(res.status).toBe(200);
    await settled(key.spend_key_id, 1);
  });

  it('a used-up total request limit answers 403 request_limit_exhausted without Retry-After and tells clients not to retry', async () => {
    const key = await createKey({ request_limit: { count: 1, cycle: 'total' } });
    expect((await chat(key.key)).status).toBe(200);
    const refused = await chat(key.key);
    expect(refused.status).toBe(403);
    expect(await codeOf(refused)).toBe('request_limit_exhausted');
    expect(refused.headers.get('retry-after')).toBeNull();
    expect(refused.headers.get('x-should-retry')).toBe('false');
    // The official client stops at once instead of retrying a limit that never resets.
    const openai = new OpenAI({ apiKey: key.key, baseURL: `${base}/v1`, maxRetries: 2 });
    const before = upstream.requests.length;
    await expect(openai.chat.completions.create({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] })).rejects.toMatchObject({
      status: 403,
    });
    expect(upstream.requests.length).toBe(before);
    const after = await settled(key.spend_key_id, 1);
    expect(after).toMatchObject({ current_requests: 1, total_requests: 1 });
  });

  it("refuses a key on the other shape's endpoint with 403 request_shape_mismatch, even for a model that endpoint cannot route", async () => {
    const anthropicKey = await createKey({ request_shape: 'anthropic' });
    const claudeOnChat = await chat(anthropicKey.key, { model: 'claude-sonnet-4-5' });
    expect(claudeOnChat.status).toBe(403);
    expect(await codeOf(claudeOnChat)).toBe('request_shape_mismatch');

    const openaiKey = await createKey();
    for (const model of ['claude-sonnet-4-5', 'gpt-4o']) {
      const viaMessages = await fetch(`${base}/v1/messages`, {
        method: 'POST',
        headers: { 'x-api-key': openaiKey.key, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
        body: JSON.stringify({ model, max_tokens: 3, messages: [{ role: 'user', content: 'x' }] }),
      });
      expect(viaMessages.status).toBe(403);
      expect(await codeOf(viaMessages)).toBe('request_shape_mismatch');
    }
  });

  it('refuses a wallet key on the gateway: 403 forbidden when live, 401 when unknown or revoked', async () => {
    const created = await t.app.inject({ method: 'POST', url: '/v1/wallet_keys', headers: t.auth(), payload: { name: 'owner' } });
    const walletKey = created.json() as { key: string; wallet_key_id: string };
    const forward = (key: string) =>
      fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
      });
    const before = upstream.requests.length;
    for (const res of [await forward(walletKey.key), await chat(walletKey.key)]) {
      expect(res.status).toBe(403);
      expect(await codeOf(res)).toBe('forbidden');
    }
    const messages = await fetch(`${base}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': walletKey.key, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'x' }] }),
    });
    expect(messages.status).toBe(403);
    expect(upstream.requests.length).toBe(before);

    const unknown = await chat('wk_live_unknownkey');
    expect(unknown.status).toBe(401);
    expect(await codeOf(unknown)).toBe('unauthorized');
    await t.app.inject({ method: 'DELETE', url: `/v1/wallet_keys/${walletKey.wallet_key_id}`, headers: t.auth() });
    expect((await forward(walletKey.key)).status).toBe(401);
  });

  it('refuses a spend key whose customer wallet is empty with 402 insufficient_balance, counting nothing', async () => {
    const customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: { name: 'Broke' } })).json() as Json;
    const key = await createKey({ customer_id: customer.customer_id, request_limit: { count: 5, cycle: 'daily' } });
    const refused = await chat(key.key);
    expect(refused.status).toBe(402);
    expect(await codeOf(refused)).toBe('insufficient_balance');
    expect(await retrieve(key.spend_key_id)).toMatchObject({ current_requests: 0, total_requests: 0, last_used_at: null });
  });

  it('enforces the rate limit as a token bucket with 429 and Retry-After', async () => {
    const key = await createKey({ rate_limit: { rpm: 60, burst: 2 } });
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await chat(key.key)).status);
    expect(statuses).toEqual([200, 200, 429]);
    const refused = await chat(key.key);
    expect(await codeOf(refused)).toBe('spend_key_rate_limited');
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    t.clock.advance(1100);
    expect((await chat(key.key)).status).toBe(200);
  });

  it('works through /v1/forward too, with the same checks', async () => {
    const key = await createKey({ allowed_models: ['gpt-4o'] });
    const forward = (model: string) =>
      fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
      });
    expect((await forward('gpt-4o')).status).toBe(200);
    expect((await forward('gpt-4o-mini')).status).toBe(403);
  });

  it('bills a customer wallet key to the customer', async () => {
    const customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: { name: 'Wallet Owner' } })).json() as Json;
    const grant = await t.app.inject({
      method: 'POST',
      url: `/v1/customers/${customer.customer_id as string}/credits`,
      headers: t.auth(),
      payload: { amount: '1' },
    });
    expect(grant.statusCode).toBeLessThan(300);
    const key = await createKey({ customer_id: customer.customer_id });
    expect((await chat(key.key)).status).toBe(200);
    const after = await settled(key.spend_key_id, 1);
    const wallet = await t.storage.db.selectFrom('wallets').selectAll().where('id', '=', key.wallet_id as string).executeTakeFirstOrThrow();
    expect(parseMoney('1') - BigInt(wallet.balance)).toBe(parseMoney(after.total_spend as string));
    expect(parseMoney(after.total_spend as string)).toBeGreaterThan(0n);
  });
});

/** The spend-key token buckets live in Redis when REDIS_URL is set; Redis going away must not fail requests. */
describe.each(databasesUnderTest())('spend key rate limits while Redis is unreachable on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  /** Stands where Redis should be: takes each connection and drops it at once, counting them. */
  let unreachable: Server;
  let connectionAttempts = 0;

  beforeAll(async () => {
    unreachable = createServer((socket) => {
      connectionAttempts++;
      socket.destroy();
    });
    await new Promise<void>((resolve) => unreachable.listen(0, '127.0.0.1', resolve));
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-openai-managed' },
      env: { REDIS_URL: `redis://127.0.0.1:${(unreachable.address() as AddressInfo).port}` },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
    unreachable?.close();
  });

  it('takes tokens from the database bucket instead: the limit still holds and nothing is a 500', async () => {
    // ioredis prints "[ioredis] Unhandled error event" for a client without an error listener.
    const printed: string[] = [];
    const spy = vi.spyOn(console, 'error').mockImplementation((...args: unknown[]) => void printed.push(args.map(String).join(' ')));
    const created = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'k', rate_limit: { rpm: 1, burst: 3 } } });
    const { key, spend_key_id: id } = created.json() as { key: string; spend_key_id: string };
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }),
      });
      statuses.push(res.status);
      if (res.status === 429) expect(((await res.json()) as { error: { code: string } }).error.code).toBe('spend_key_rate_limited');
      else await res.arrayBuffer();
    }
    expect(statuses).toEqual([200, 200, 200, 429, 429]);
    // The database bucket was drawn down (the Redis path never touches these columns): under one token left.
    const row = await t.storage.db.selectFrom('spend_keys').select('bucket_units').where('id', '=', id).executeTakeFirstOrThrow();
    expect(Number(row.bucket_units)).toBeLessThan(60_000);
    // ioredis' reconnection attempts fail too, quietly.
    const attempted = connectionAttempts;
    await until(() => connectionAttempts >= attempted + 2, 'ioredis to try reconnecting twice more');
    spy.mockRestore();
    expect(printed.filter((line) => line.includes('ioredis'))).toEqual([]);
  });
});
