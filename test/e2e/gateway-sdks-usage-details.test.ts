import Anthropic from '@anthropic-ai/sdk';
import { GoogleGenAI } from '@google/genai';
import { Lava } from '@lavapayments/nodejs';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

/**
 * Records show the parts of their usage that are billed inside another count: reasoning
 * (thinking) tokens inside output_tokens, cache reads and writes inside input_tokens. The official
 * clients call the drop-in endpoints with the merchant's secret key, as JSON and as streams; the
 * records are read back through the published client's requests.list and GET /v1/requests/{id}.
 */
describe.each(databasesUnderTest())('usage details on request records on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let lava: Lava;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, THREE_PROVIDERS));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
    lava = new Lava(t.merchant.secretKey, { baseUrl: `${base}/v1/` });
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const openai = () => new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1`, maxRetries: 0 });
  const anthropic = () => new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base, maxRetries: 0 });
  const genai = () => new GoogleGenAI({ apiKey: t.merchant.secretKey, httpOptions: { baseUrl: base } });

  /** The settled record, as GET /v1/requests/{id} and the published client's list both show it. */
  async function recordOf(requestId: string | null | undefined) {
    const record = await t.settledRecord(requestId ?? null);
    const listed = await lava.requests.list({ limit: 20 });
    const item = listed.data.find((r) => r.request_id === requestId) as unknown as { model_usage: unknown } | undefined;
    expect(item?.model_usage).toEqual(record.model_usage);
    return record;
  }

  /** The newest record: @google/genai streams do not show their response headers. */
  function newestRequestId(before: string | undefined): Promise<string> {
    return until(async () => {
      const newest: string | undefined = (await t.app.inject({ method: 'GET', url: '/v1/requests?limit=1', headers: t.auth() })).json().data[0]?.request_id;
      return newest !== before && newest;
    }, 'a new record');
  }
  const newestNow = async (): Promise<string | undefined> => (await t.app.inject({ method: 'GET', url: '/v1/requests?limit=1', headers: t.auth() })).json().data[0]?.request_id;

  it('openai chat completion: completion_tokens_details.reasoning_tokens is kept apart, inside output_tokens', async () => {
    upstream.setNext({ path: '/chat/completions', reasoningTokens: 3 });
    const { data, response } = await openai()
      .chat.completions.create({ model: 'o3-mini', messages: [{ role: 'user', content: 'think about it' }], max_completion_tokens: 7 })
      .withResponse();
    expect(data.usage?.completion_tokens_details?.reasoning_tokens).toBe(3);
    const record = await recordOf(response.headers.get('x-tollgate-request-id'));
    expect(record.model_usage).toMatchObject({ output_tokens: 7, reasoning_tokens: 3, input_tokens: 3, price_unit: 'tokens' });
  });

  it('openai chat stream: the reasoning count of the usage chunk is kept', async () => {
    upstream.setNext({ path: '/chat/completions', reasoningTokens: 2 });
    const { data: stream, response } = await openai()
      .chat.completions.create({ model: 'o3-mini', messages: [{ role: 'user', content: 'think' }], max_completion_tokens: 5, stream: true })
      .withResponse();
    for await (const chunk of stream) void chunk;
    const record = await recordOf(response.headers.get('x-tollgate-request-id'));
    expect(record.model_usage).toMatchObject({ output_tokens: 5, reasoning_tokens: 2 });
  });

  it('openai responses, JSON and streamed: output_tokens_details.reasoning_tokens is kept', async () => {
    upstream.setNext({ path: '/responses', reasoningTokens: 4, times: 2 });
    const { response } = await openai().responses.create({ model: 'o3', input: 'one two', max_output_tokens: 6 }).withResponse();
    expect((await recordOf(response.headers.get('x-tollgate-request-id'))).model_usage).toMatchObject({ output_tokens: 6, reasoning_tokens: 4 });

    const streamed = await openai().responses.create({ model: 'o3', input: 'one two', max_output_tokens: 6, stream: true }).withResponse();
    for await (const event of streamed.data) void event;
    expect((await recordOf(streamed.response.headers.get('x-tollgate-request-id'))).model_usage).toMatchObject({ output_tokens: 6, reasoning_tokens: 4 });
  });

  it('gemini, JSON and streamed: thoughtsTokenCount is kept as reasoning, cachedContentTokenCount as cached input', async () => {
    upstream.setNext({ path: ':generateContent', reasoningTokens: 4, cachedTokens: 2 });
    const before = await newestNow();
    const answer = await genai().models.generateContent({ model: 'gemini-2.5-flash', contents: 'one two three', config: { maxOutputTokens: 6 } });
    expect(answer.usageMetadata).toMatchObject({ thoughtsTokenCount: 4, candidatesTokenCount: 2, cachedContentTokenCount: 2 });
    const record = await recordOf(await newestRequestId(before));
    expect(record.model_usage).toMatchObject({ input_tokens: 3, cached_input_tokens: 2, output_tokens: 6, reasoning_tokens: 4 });

    upstream.setNext({ path: ':streamGenerateContent', reasoningTokens: 3 });
    const beforeStream = await newestNow();
    for await (const chunk of await genai().models.generateContentStream({ model: 'gemini-2.5-flash', contents: 'one two three', config: { maxOutputTokens: 5 } })) void chunk;
    const streamed = await recordOf(await newestRequestId(beforeStream));
    expect(streamed.model_usage).toMatchObject({ output_tokens: 5, reasoning_tokens: 3 });
  });

  it('anthropic, JSON and streamed: cache reads and writes are kept inside input_tokens; no reasoning count is reported', async () => {
    upstream.setNext({ path: '/messages', cachedTokens: 2, cacheWriteTokens: 1, times: 2 });
    const { data, response } = await anthropic()
      .messages.create({ model: 'claude-sonnet-4-5', max_tokens: 4, messages: [{ role: 'user', content: 'one two three four five' }] })
      .withResponse();
    expect(data.usage).toMatchObject({ input_tokens: 2, cache_read_input_tokens: 2, cache_creation_input_tokens: 1 });
    const record = await recordOf(response.headers.get('x-tollgate-request-id'));
    expect(record.model_usage).toMatchObject({ input_tokens: 5, cached_input_tokens: 2, cache_write_input_tokens: 1, output_tokens: 4, reasoning_tokens: 0 });

    const streamed = await anthropic()
      .messages.create({ model: 'claude-sonnet-4-5', max_tokens: 4, stream: true, messages: [{ role: 'user', content: 'one two three four five' }] })
      .withResponse();
    for await (const event of streamed.data) void event;
    const streamedRecord = await recordOf(streamed.response.headers.get('x-tollgate-request-id'));
    expect(streamedRecord.model_usage).toMatchObject({ input_tokens: 5, cached_input_tokens: 2, cache_write_input_tokens: 1, output_tokens: 4 });
  });

  it('the OpenAPI document describes the new usage fields of a request record', async () => {
    const document = (await t.app.inject({ method: 'GET', url: '/v1/openapi.json' })).json();
    const text = JSON.stringify(document);
    for (const field of ['reasoning_tokens', 'cached_input_tokens', 'cache_write_input_tokens', 'output_images', 'price_unit']) {
      expect(text).toContain(`"${field}"`);
    }
    expect(text).toContain('Part of output_tokens the model spent reasoning');
  });
});
