import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Providers answer under a dated name (`gpt-4o-mini` is served as `gpt-4o-mini-2024-07-18`). The
 * record names the model the provider served, read from its answer or its stream, on every path
 * (forward, drop-in, rewrite; JSON and streams), and keeps the requested name beside it.
 */
describe.each(databasesUnderTest())('the served model on request records on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      ...THREE_PROVIDERS,
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });
  beforeEach(() => upstream.reset());

  const openaiOn = (baseURL: string) => new OpenAI({ apiKey: t.merchant.secretKey, baseURL, maxRetries: 0 });
  const anthropicOn = (baseURL: string) => new Anthropic({ apiKey: t.merchant.secretKey, baseURL, maxRetries: 0 });
  const forwardBase = `?u=https://api.openai.com/v1`;
  const chat = { model: 'gpt-4o-mini', messages: [{ role: 'user' as const, content: 'one two' }], max_tokens: 3 };

  const expectServed = async (requestId: string | null, model: string, requested: string | null) => {
    const record = await t.settledRecord(requestId);
    expect(record).toMatchObject({ status: 'completed', model, requested_model: requested });
    return record;
  };

  for (const [path, baseURL] of [
    ['forward', () => `${base}/v1/forward${forwardBase}`],
    ['drop-in', () => `${base}/v1`],
  ] as const) {
    it(`records the served model of a JSON chat answer on ${path}, with the requested one beside it`, async () => {
      upstream.setNext({ servedModel: 'gpt-4o-mini-2024-07-18' });
      const { data, response } = await openaiOn(baseURL()).chat.completions.create(chat).withResponse();
      expect(data.model).toBe('gpt-4o-mini-2024-07-18');
      await expectServed(response.headers.get('x-tollgate-request-id'), 'gpt-4o-mini-2024-07-18', 'gpt-4o-mini');
    });

    it(`records the served model of a streamed chat answer on ${path}, with the requested one beside it`, async () => {
      upstream.setNext({ servedModel: 'gpt-4o-mini-2024-07-18' });
      const { data: stream, response } = await openaiOn(baseURL()).chat.completions.create({ ...chat, stream: true }).withResponse();
      let text = '';
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
      expect(text).toBe('tok tok tok');
      await expectServed(response.headers.get('x-tollgate-request-id'), 'gpt-4o-mini-2024-07-18', 'gpt-4o-mini');
    });
  }

  it('leaves requested_model null when the provider answers under the requested name', async () => {
    const { response } = await openaiOn(`${base}/v1`).chat.completions.create({ ...chat, stream: true }).withResponse();
    await response.text();
    await expectServed(response.headers.get('x-tollgate-request-id'), 'gpt-4o-mini', null);
  });

  it('records the served model of Anthropic answers on the drop-in, streamed and not', async () => {
    const anthropic = anthropicOn(base);
    const message = { model: 'claude-haiku-4-5', max_tokens: 3, messages: [{ role: 'user' as const, content: 'one two' }] };
    upstream.setNext({ servedModel: 'claude-haiku-4-5-20251001' });
    const json = await anthropic.messages.create(message).withResponse();
    await expectServed(json.response.headers.get('x-tollgate-request-id'), 'claude-haiku-4-5-20251001', 'claude-haiku-4-5');
    upstream.setNext({ servedModel: 'claude-haiku-4-5-20251001' });
    const streamed = await anthropic.messages.create({ ...message, stream: true }).withResponse();
    for await (const _event of streamed.data);
    await expectServed(streamed.response.headers.get('x-tollgate-request-id'), 'claude-haiku-4-5-20251001', 'claude-haiku-4-5');
  });

  it('records the served model of the provider behind the rewrite proxy, streamed and not', async () => {
    // An Anthropic client, an OpenAI provider: the record is the provider's.
    const anthropic = anthropicOn(`${base}/v1/rewrite/anthropic/https://api.openai.com/v1`);
    const message = { model: 'gpt-4o-mini', max_tokens: 3, messages: [{ role: 'user' as const, content: 'one two' }] };
    upstream.setNext({ servedModel: 'gpt-4o-mini-2024-07-18' });
    const json = await anthropic.messages.create(message).withResponse();
    expect(json.data.model).toBe('gpt-4o-mini-2024-07-18');
    await expectServed(json.response.headers.get('x-tollgate-request-id'), 'gpt-4o-mini-2024-07-18', 'gpt-4o-mini');
    upstream.setNext({ servedModel: 'gpt-4o-mini-2024-07-18' });
    const streamed = await anthropic.messages.create({ ...message, stream: true }).withResponse();
    for await (const _event of streamed.data);
    await expectServed(streamed.response.headers.get('x-tollgate-request-id'), 'gpt-4o-mini-2024-07-18', 'gpt-4o-mini');
  });

  it('records the served model of a streamed Gemini answer through forward', async () => {
    upstream.setNext({ servedModel: 'gemini-2.0-flash-001' });
    const target = 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse';
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(target)}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'one two' }] }], generationConfig: { maxOutputTokens: 2 } }),
    });
    expect(res.status).toBe(200);
    await res.text();
    await expectServed(res.headers.get('x-tollgate-request-id'), 'gemini-2.0-flash-001', 'gemini-2.0-flash');
  });
});
