import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Tollgate's own refusals on provider-shaped routes come in that provider's error shape, with the
 * interface's code and status kept, so each provider's client surfaces the message and type.
 * The merchant's wallet is empty: every call is refused with 402 before any provider call.
 */
describe('refusals in each surface’s own dialect', () => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock('sqlite', {
      ...THREE_PROVIDERS,
    }));
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  it("answers OpenAI's error shape on the OpenAI drop-in, and openai 7 surfaces its message and code", async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1`, maxRetries: 0 });
    const error = await openai.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    const apiError = error as InstanceType<typeof OpenAI.APIError>;
    expect(apiError.status).toBe(402);
    expect(apiError.code).toBe('insufficient_balance');
    expect(apiError.type).toBe('insufficient_quota');
    expect(apiError.param).toBeNull();
    expect(apiError.message).toContain('The wallet balance cannot cover this request.');
    expect(upstream.requests).toHaveLength(0);
  });

  it("answers Anthropic's {type:'error', error:{type, message}} on /v1/messages, which @anthropic-ai/sdk reads", async () => {
    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base, maxRetries: 0 });
    const error = await anthropic.messages.create({ model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Anthropic.APIError);
    const apiError = error as InstanceType<typeof Anthropic.APIError>;
    expect(apiError.status).toBe(402);
    expect(apiError.error).toEqual({
      type: 'error',
      error: {
        type: 'billing_error',
        message: 'The wallet balance cannot cover this request.',
        details: { error_code: 'insufficient_balance' },
        code: 'insufficient_balance',
        status: 402,
      },
    });
    expect(apiError.errorCode).toBe('insufficient_balance');
  });

  it("answers a forward to Gemini in Google's {error:{code, message, status}}, the interface's code as the reason", async () => {
    const res = await fetch(`${base}/v1/forward/models/gemini-2.0-flash:generateContent?u=${encodeURIComponent('https://generativelanguage.googleapis.com/v1beta')}`, {
      method: 'POST',
      headers: { 'x-goog-api-key': 'sk_live_not_a_key', 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(401);
    const body = (await res.json()) as { error: { code: number; message: string; status: string; details: { reason: string }[] } };
    expect(body.error.code).toBe(401);
    expect(body.error.status).toBe('UNAUTHENTICATED');
    expect(body.error.details[0]!.reason).toBe('unauthorized');
    expect(typeof body.error.message).toBe('string');
  });

  it("answers a forward to an OpenAI-compatible provider in OpenAI's shape, a validation issue as its param", async () => {
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, { method: 'POST' });
    expect(res.status).toBe(401);
    expect(((await res.json()) as { error: Record<string, unknown> }).error).toMatchObject({ type: 'authentication_error', code: 'unauthorized', status: 401 });
  });

  it("keeps Tollgate's own envelope when the forward URL names no provider", async () => {
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://evil.example/x')}`, { headers: { authorization: `Bearer ${t.merchant.secretKey}` } });
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({ error: { code: 'unsupported_provider', status: 400, message: expect.any(String) } });
  });
});

/**
 * Errors Tollgate answers after the relay began (the provider never answered), and every refusal
 * of the rewrite proxy, in the dialect of the client's own surface (decision 0021).
 */
describe('errors after the relay began, and on the rewrite proxy, in the caller’s dialect', () => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock('sqlite', {
      ...THREE_PROVIDERS,
      env: { UPSTREAM_TIMEOUT_MS: '300' },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const message = { model: 'gpt-4o-mini', max_tokens: 2, messages: [{ role: 'user' as const, content: 'hi' }] };

  it('answers a provider timeout on /v1/messages in Anthropic’s dialect, typed timeout_error', async () => {
    upstream.setNext({ hang: true });
    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base, maxRetries: 0 });
    const error = (await anthropic.messages.create({ ...message, model: 'claude-haiku-4-5' }).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(error).toBeInstanceOf(Anthropic.APIError);
    expect(error.status).toBe(504);
    expect(error.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'upstream_timeout', status: 504 } });
  });

  it('answers a provider timeout behind the rewrite proxy in the client’s dialect, not the provider’s', async () => {
    upstream.setNext({ hang: true });
    // An Anthropic client calling an OpenAI model.
    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1/rewrite/anthropic/https://api.openai.com/v1`, maxRetries: 0 });
    const error = (await anthropic.messages.create(message).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(error).toBeInstanceOf(Anthropic.APIError);
    expect(error.status).toBe(504);
    expect(error.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'upstream_timeout' } });
  });

  it('answers a provider timeout on the native Gemini drop-in in Google’s dialect', async () => {
    upstream.setNext({ hang: true });
    const res = await fetch(`${base}/v1beta/models/gemini-2.0-flash:generateContent`, {
      method: 'POST',
      headers: { 'x-goog-api-key': t.merchant.secretKey, 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [{ parts: [{ text: 'hi' }] }] }),
    });
    expect(res.status).toBe(504);
    const body = (await res.json()) as { error: { code: number; status: string; details: { reason: string }[] } };
    expect(body.error).toMatchObject({ code: 504, status: 'DEADLINE_EXCEEDED' });
    expect(body.error.details[0]!.reason).toBe('upstream_timeout');
  });

  it('refuses on the rewrite proxy in the client’s dialect: Anthropic’s for an unknown key, OpenAI’s for an untranslatable field', async () => {
    upstream.reset();
    const anthropic = new Anthropic({ apiKey: 'sk_live_unknownunknownunknown', baseURL: `${base}/v1/rewrite/anthropic/https://api.openai.com/v1`, maxRetries: 0 });
    const unknown = (await anthropic.messages.create(message).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(unknown).toBeInstanceOf(Anthropic.APIError);
    expect(unknown.status).toBe(401);
    expect(unknown.error).toMatchObject({ type: 'error', error: { type: 'authentication_error', code: 'unauthorized' } });

    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1/rewrite/openai/https://api.anthropic.com/v1`, maxRetries: 0 });
    const untranslatable = (await openai.chat.completions
      .create({ model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }], logprobs: true })
      .catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(untranslatable).toBeInstanceOf(OpenAI.APIError);
    expect(untranslatable.status).toBe(400);
    expect(untranslatable.code).toBe('untranslatable_request');
    expect(untranslatable.type).toBe('invalid_request_error');
    expect(untranslatable.param).toBe('logprobs');
    expect(upstream.requests).toHaveLength(0);
  });

  it('keeps Tollgate’s envelope on the rewrite proxy for a format it does not speak', async () => {
    const res = await fetch(`${base}/v1/rewrite/bedrock/https://api.openai.com/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('unsupported_format');
  });
});
