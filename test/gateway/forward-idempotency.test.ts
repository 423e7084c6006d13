import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { REPLAY_LIMIT_BYTES } from '../../src/gateway/forward-idempotency.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

/**
 * `Idempotency-Key` on forwarded calls, driven by the openai client through /v1/forward and the
 * drop-in endpoint: a retry with the same key never reaches the provider and is never charged
 * again. The merchant's own key pays the base cost (gpt-4o at the catalog's 2.5 in / 10 out per
 * 1M): a call of 2 prompt words and 3 output tokens costs 0.000035.
 */
const ONE_CALL = parseMoney('0.000035');

describe.each(databasesUnderTest())('Idempotency-Key on forwarded calls on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-openai-managed' },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const balance = async () => (await findWallet(t.storage, t.merchant.walletId))!.balance;
  const viaForward = () => new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1/forward?u=https://api.openai.com/v1`, maxRetries: 0 });
  const viaDropIn = () => new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1`, maxRetries: 0 });
  const chat = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hello there' }], max_tokens: 3 };
  const withKey = (key: string) => ({ headers: { 'Idempotency-Key': key } });
  /** The first call's key is written just after its answer ended: a retry made sooner is told the call is in flight. */
  const isInUse = (err: unknown) => err instanceof OpenAI.ConflictError && (err.error as { code?: string }).code === 'idempotency_key_in_use';
  function onceWritten<T>(call: () => Promise<T>): Promise<T> {
    return until(async () => {
      try {
        return { value: await call() };
      } catch (err) {
        if (!isInUse(err)) throw err;
        return undefined;
      }
    }, 'the first call to be written (its key no longer in use)').then((answer) => answer.value);
  }
  const upstreamCalls = () => upstream.requests.filter((r) => r.path === '/v1/chat/completions').length;
  function expectConflict(retry: unknown, code: string) {
    expect(retry).toBeInstanceOf(OpenAI.ConflictError);
    expect((retry as InstanceType<typeof OpenAI.ConflictError>).error).toMatchObject({ code });
  }
  /**
   * Holds the first call with `key` at the provider, runs `meanwhile`, then retries with the same
   * key: the retry is told the key is in use, and the provider is called once.
   */
  async function retryWhileAtProvider(key: string, meanwhile: () => void) {
    let answer!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answer = resolve)) });
    const calls = upstreamCalls();
    const first = viaForward().chat.completions.create(chat, withKey(key));
    await vi.waitFor(() => expect(upstreamCalls()).toBeGreaterThan(calls));

    meanwhile();
    const retry = await viaForward().chat.completions.create(chat, withKey(key)).catch((err: unknown) => err);
    expectConflict(retry, 'idempotency_key_in_use');
    answer();
    const { response } = await first.withResponse();
    await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(upstreamCalls() - calls).toBe(1);
  }

  for (const [route, client] of [
    ['/v1/forward', viaForward],
    ['the drop-in /v1/chat/completions', viaDropIn],
  ] as const) {
    it(`${route}: a retry with the same key replays the answer, calls the provider once and is charged once`, async () => {
      const key = `retry-${route}-${dialect}`;
      const calls = upstreamCalls();
      const before = await balance();
      const first = await client().chat.completions.create(chat, withKey(key)).withResponse();
      const firstId = first.response.headers.get('x-tollgate-request-id');
      await t.settledRecord(firstId);
      const second = await onceWritten(() => client().chat.completions.create(chat, withKey(key)).withResponse());

      expect(second.data).toEqual(first.data);
      expect(second.response.headers.get('idempotent-replayed')).toBe('true');
      expect(second.response.headers.get('x-tollgate-request-id')).toBe(firstId);
      expect(second.response.headers.get('x-lava-request-id')).toBe(firstId);
      expect(first.response.headers.get('idempotent-replayed')).toBeNull();
      expect(upstreamCalls() - calls).toBe(1);
      expect(before - (await balance())).toBe(ONE_CALL);
    });
  }

  it('a streamed answer is replayed whole, event for event, and charged once', async () => {
    const calls = upstreamCalls();
    const before = await balance();
    const collect = async () => {
      const stream = await viaForward().chat.completions.create({ ...chat, stream: true }, withKey(`stream-${dialect}`));
      const chunks: unknown[] = [];
      for await (const chunk of stream) chunks.push(chunk);
      return chunks;
    };
    const first = await collect();
    const replayed = await onceWritten(collect);
    expect(replayed).toEqual(first);
    expect(first.length).toBeGreaterThan(3);
    expect(upstreamCalls() - calls).toBe(1);
    // The stream's record settles off the response path: wait until the balance moved.
    await until(async () => (await balance()) !== before, 'the balance to move');
    expect(before - (await balance())).toBe(ONE_CALL);
  });

  it('a retry while the first call is still at the provider gets 409 idempotency_key_in_use, and the provider is called once', async () => {
    await retryWhileAtProvider(`in-flight-${dialect}`, () => {});
  });

  it("a call still at the provider past a standard endpoint's 60 s lease keeps its key: a retry gets 409 idempotency_key_in_use", async () => {
    await retryWhileAtProvider(`long-call-${dialect}`, () => t.clock.advance(61_000));
  });

  it('the same key with another body is refused with 422 idempotency_key_reused before the provider is called', async () => {
    const key = `reused-${dialect}`;
    const { response } = await viaForward().chat.completions.create(chat, withKey(key)).withResponse();
    await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    const calls = upstreamCalls();
    const other = await onceWritten(() => viaForward().chat.completions.create({ ...chat, max_tokens: 4 }, withKey(key))).catch((err: unknown) => err);
    expect(other).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expect((other as InstanceType<typeof OpenAI.APIError>).error).toMatchObject({ code: 'idempotency_key_reused' });
    expect(upstreamCalls()).toBe(calls);
  });

  it('a provider server error frees the key: the retry goes to the provider and is charged once', async () => {
    upstream.setNext({ path: '/chat/completions', status: 500 });
    const key = `server-error-${dialect}`;
    const before = await balance();
    const failed = await viaForward().chat.completions.create(chat, withKey(key)).catch((err: unknown) => err);
    expect(failed).toBeInstanceOf(OpenAI.InternalServerError);
    const { data, response } = await viaForward().chat.completions.create(chat, withKey(key)).withResponse();
    expect(data.choices[0]!.message.content).toBe('tok tok tok');
    expect(response.headers.get('idempotent-replayed')).toBeNull();
    await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(before - (await balance())).toBe(ONE_CALL);
  });

  it('an answer over 8 MiB reaches the client whole but is not kept: a retry gets 409 idempotent_answer_not_kept', async () => {
    expect(REPLAY_LIMIT_BYTES).toBe(8 * 1024 * 1024);
    // "tok" and then " tok" per output token: just over 8 MiB of content.
    const outputTokens = Math.ceil(REPLAY_LIMIT_BYTES / 4) + 1000;
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('30'), new Date().toISOString());
    upstream.setNext({ path: '/chat/completions', outputTokens });
    const key = `too-big-${dialect}`;
    const calls = upstreamCalls();
    const first = await viaForward().chat.completions.create(chat, withKey(key)).withResponse();
    expect(first.data.choices[0]!.message.content).toHaveLength(4 * outputTokens - 1);
    await t.settledRecord(first.response.headers.get('x-tollgate-request-id'));
    const retry = await onceWritten(() => viaForward().chat.completions.create(chat, withKey(key))).catch((err: unknown) => err);
    expectConflict(retry, 'idempotent_answer_not_kept');
    expect(upstreamCalls() - calls).toBe(1);
  });

  it('an answer cut by the provider was charged but not kept: a retry gets 409 idempotent_answer_not_kept', async () => {
    upstream.setNext({ path: '/chat/completions', cutAfterChunks: 2 });
    const key = `cut-${dialect}`;
    const calls = upstreamCalls();
    const stream = await viaForward().chat.completions.create({ ...chat, stream: true }, withKey(key));
    await (async () => {
      for await (const chunk of stream) void chunk;
    })().catch(() => undefined);
    const retry = await onceWritten(() => viaForward().chat.completions.create({ ...chat, stream: true }, withKey(key))).catch((err: unknown) => err);
    expectConflict(retry, 'idempotent_answer_not_kept');
    expect(upstreamCalls() - calls).toBe(1);
  });
});
