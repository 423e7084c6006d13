import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Prompt-cache tokens are billed at the provider's cache prices, for each provider family's own
 * way of reporting them. Prices are the @pydantic/genai-prices catalog's, per 1M tokens:
 *   gpt-4o-mini        input 0.15, cache read 0.075, output 0.6
 *   claude-sonnet-4-0  input 3, cache read 0.3, cache write 3.75, output 15
 *   gemini-2.0-flash   input 0.1, cache read 0.025, output 0.4
 * The mock counts one input token per prompt word, so a 1000-word prompt is 1000 input tokens.
 */

const PROMPT = Array.from({ length: 1000 }, (_, i) => `w${i}`).join(' ');

describe.each(databasesUnderTest())('prompt-cache billing on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      ...THREE_PROVIDERS,
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  async function forward(target: string, body: unknown) {
    const before = (await findWallet(t.storage, t.merchant.walletId))!.balance;
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(target)}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    const after = (await findWallet(t.storage, t.merchant.walletId))!;
    return { record, charged: before - after.balance, held: after.held };
  }

  it('OpenAI: cached prompt tokens (a part of prompt_tokens) are billed at the cache-read price', async () => {
    upstream.setNext({ path: '/chat/completions', cachedTokens: 400 });
    const { record, charged, held } = await forward('https://api.openai.com/v1/chat/completions', {
      model: 'gpt-4o-mini',
      max_tokens: 10,
      messages: [{ role: 'user', content: PROMPT }],
    });
    expect(record.model_usage).toMatchObject({
      input_tokens: 1000,
      cached_input_tokens: 400,
      cache_write_input_tokens: 0,
      output_tokens: 10,
      total_tokens: 1010,
      // 600 × 0.15 + 400 × 0.075 = 120 per 1M; 10 × 0.6 = 6 per 1M
      input_cost: '0.0001200000',
      output_cost: '0.0000060000',
      total_cost: '0.0001260000',
    });
    expect(charged).toBe(parseMoney('0.000126'));
    expect(held).toBe(0n);
  });

  it('OpenAI stream: the cached tokens of the final usage chunk are billed at the cache-read price', async () => {
    upstream.setNext({ path: '/chat/completions', cachedTokens: 1000 });
    const { record } = await forward('https://api.openai.com/v1/chat/completions', {
      model: 'gpt-4o-mini',
      stream: true,
      max_tokens: 10,
      messages: [{ role: 'user', content: PROMPT }],
    });
    // 1000 × 0.075 = 75 per 1M
    expect(record).toMatchObject({ usage_estimated: false, cost: '0.0000810000' });
    expect(record.model_usage).toMatchObject({ input_tokens: 1000, cached_input_tokens: 1000, input_cost: '0.0000750000' });
  });

  it('Anthropic: cache reads and writes (reported beside input_tokens) are added to the input and priced each at its own price', async () => {
    upstream.setNext({ path: '/messages', cachedTokens: 400, cacheWriteTokens: 100 });
    const { record, charged } = await forward('https://api.anthropic.com/v1/messages', {
      model: 'claude-sonnet-4-0',
      max_tokens: 10,
      messages: [{ role: 'user', content: PROMPT }],
    });
    expect(record.model_usage).toMatchObject({
      input_tokens: 1000,
      cached_input_tokens: 400,
      cache_write_input_tokens: 100,
      output_tokens: 10,
      total_tokens: 1010,
      // 500 × 3 + 400 × 0.3 + 100 × 3.75 = 1995 per 1M; 10 × 15 = 150 per 1M
      input_cost: '0.0019950000',
      output_cost: '0.0001500000',
      total_cost: '0.0021450000',
    });
    expect(charged).toBe(parseMoney('0.002145'));
  });

  it('Anthropic stream: the cache counts of message_start are billed the same way', async () => {
    upstream.setNext({ path: '/messages', cachedTokens: 400, cacheWriteTokens: 100 });
    const { record } = await forward('https://api.anthropic.com/v1/messages', {
      model: 'claude-sonnet-4-0',
      stream: true,
      max_tokens: 10,
      messages: [{ role: 'user', content: PROMPT }],
    });
    expect(record).toMatchObject({ usage_estimated: false, cost: '0.0021450000' });
    expect(record.model_usage).toMatchObject({ input_tokens: 1000, cached_input_tokens: 400, cache_write_input_tokens: 100 });
  });

  it('Gemini: cachedContentTokenCount (a part of promptTokenCount) is billed at the cache-read price', async () => {
    upstream.setNext({ cachedTokens: 400 });
    const { record, charged } = await forward('https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:generateContent', {
      contents: [{ role: 'user', parts: [{ text: PROMPT }] }],
      generationConfig: { maxOutputTokens: 10 },
    });
    expect(record.model_usage).toMatchObject({
      input_tokens: 1000,
      cached_input_tokens: 400,
      output_tokens: 10,
      // 600 × 0.1 + 400 × 0.025 = 70 per 1M; 10 × 0.4 = 4 per 1M
      input_cost: '0.0000700000',
      output_cost: '0.0000040000',
      total_cost: '0.0000740000',
    });
    expect(charged).toBe(parseMoney('0.000074'));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a token meter counts cached input tokens as input tokens', async () => {
    const { customerId, meterSlug } = await t.customerWithMeter({
      credit: '5',
      meter: { name: 'Cache meter', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '100' }] },
    });
    const token = forwardToken(t.merchant.secretKey, customerId, meterSlug);
    upstream.setNext({ path: '/chat/completions', cachedTokens: 400 });
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 10, messages: [{ role: 'user', content: PROMPT }] }),
    });
    await res.arrayBuffer();
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    // (1000 + 10) tokens × 100 per 1M = 0.101
    expect(record.fee.amount).toBe('0.1010000000');
    expect(record.fee.breakdown[0].tokens).toBe(1010);
    expect(record.cost).toBe('0.0001260000');
  });
});
