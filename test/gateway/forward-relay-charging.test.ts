import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';
import { OPENAI_CHAT } from '../helpers/gateway.ts';
import { NO_USAGE_JSON } from '../helpers/raw-provider.ts';
import { MISTRAL_CHAT, useRelayGateway } from '../helpers/relay-gateway.ts';

/**
 * What a relayed request that did not end with a usage report is charged. Never free when the
 * provider may have worked (a client that left, an answer cut or without usage): the record is
 * settled from what the gateway saw, flagged as estimated; free when the request never reached
 * the provider or the endpoint is not billed by usage. A provider's error is relayed unchanged,
 * recorded as an error, its hold released and nothing charged.
 */

describe.each(databasesUnderTest())('forward gateway relay on %s', (dialect) => {
  const h = useRelayGateway(dialect);
  const { upstream, silent, t, customer, wallet, post } = h;

  describe('never free: the provider may have worked without reporting usage', () => {
    const recordIds = async () => new Set((await t.storage.db.selectFrom('requests').select('id').execute()).map((r) => r.id));
    const newRecordId = (known: Set<string>): Promise<string> =>
      until(async () => {
        const fresh = [...(await recordIds())].filter((id) => !known.has(id));
        return fresh.length === 1 && fresh[0]!;
      }, 'one new record');

    it('a client that leaves before the provider answers is charged for the prompt the provider received, flagged', async () => {
      upstream.setNext({ path: '/chat/completions', delayMs: 1500 });
      const known = await recordIds();
      const before = await wallet(customer.walletId);
      const seen = upstream.requests.length;
      const controller = new AbortController();
      // 16 prompt characters → 4 estimated input tokens.
      const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 50, messages: [{ role: 'user', content: 'abcdefghijklmnop' }] });
      const pending = post(OPENAI_CHAT, body, { authorization: `Bearer ${h.customerToken}` }, h.base, controller.signal).catch(() => null);
      await until(() => upstream.requests.length > seen, 'the request to reach the provider');
      controller.abort();
      expect(await pending).toBeNull();

      const record = await t.settledRecord(await newRecordId(known));
      expect(record).toMatchObject({ status: 'completed', usage_estimated: true, model_usage: { input_tokens: 4, output_tokens: 0 } });
      // gpt-4o input 2.5 per 1M: 4 × 2.5 / 1e6; the meter's fee: 4 × 100 / 1e6.
      expect(record.model_usage.input_cost).toBe('0.0000100000');
      expect(record.fee.amount).toBe('0.0004000000');
      const after = await wallet(customer.walletId);
      expect(before.balance - after.balance).toBe(parseMoney(record.total_wallet_cost));
      expect(parseMoney(record.total_wallet_cost)).toBeGreaterThan(0n);
      expect(after.held).toBe(0n);
    });

    it('a client that leaves before the request could reach the provider is charged nothing', async () => {
      // api.groq.com is mapped to a TLS port that never answers the handshake: the request is never sent.
      const known = await recordIds();
      const before = await wallet(customer.walletId);
      const controller = new AbortController();
      const pending = post(
        `u=${encodeURIComponent('https://api.groq.com/openai/v1/chat/completions')}`,
        JSON.stringify({ model: 'llama-3.3-70b-versatile', max_tokens: 50, messages: [{ role: 'user', content: 'abcdefghijklmnop' }] }),
        { authorization: `Bearer ${h.customerToken}` },
        h.base,
        controller.signal,
      ).catch(() => null);
      await until(() => silent.connections() > 0, 'the gateway to connect to the silent port');
      await sleep(50);
      controller.abort();
      expect(await pending).toBeNull();

      const record = await t.settledRecord(await newRecordId(known));
      expect(record.status).toBe('error');
      expect(parseMoney(record.total_request_cost)).toBe(0n);
      const after = await wallet(customer.walletId);
      expect(after.balance).toBe(before.balance);
      expect(after.held).toBe(0n);
    });

    it('a non-streaming answer cut by the provider is settled from the prompt and the part seen, flagged', async () => {
      const before = await wallet(customer.walletId);
      const res = await post(MISTRAL_CHAT, JSON.stringify({ model: 'mistral-small-latest', messages: [{ role: 'user', content: 'abcdefgh' }] }), {
        authorization: `Bearer ${h.customerToken}`,
        'x-test-mode': 'cut-json',
      });
      expect(res.status).toBe(200);
      await expect(res.text()).rejects.toThrow();
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      // 8 prompt characters → 2 input tokens; 40 characters seen → 10 output tokens.
      expect(record).toMatchObject({ status: 'completed', usage_estimated: true, model_usage: { input_tokens: 2, output_tokens: 10 } });
      expect(record.fee.amount).toBe('0.0012000000');
      const after = await wallet(customer.walletId);
      expect(before.balance - after.balance).toBe(parseMoney(record.total_wallet_cost));
      expect(after.held).toBe(0n);
    });

    it('a generation answer without usage is settled from the prompt and its text, flagged', async () => {
      const res = await post(MISTRAL_CHAT, JSON.stringify({ model: 'mistral-small-latest', messages: [{ role: 'user', content: 'abcdefgh' }] }), {
        authorization: `Bearer ${h.customerToken}`,
        'x-test-mode': 'no-usage',
      });
      expect(await res.text()).toBe(NO_USAGE_JSON);
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      // 2 input tokens; the answer's text is 32 characters → 8 output tokens; fee 10 × 100 / 1e6.
      expect(record).toMatchObject({ status: 'completed', usage_estimated: true, model_usage: { input_tokens: 2, output_tokens: 8 } });
      expect(record.fee.amount).toBe('0.0010000000');
    });

    it('an answer without usage from an endpoint not billed by usage (a model list) stays free and unflagged', async () => {
      const res = await fetch(`${h.base}/v1/forward?u=${encodeURIComponent('https://api.mistral.ai/v1/models')}`, {
        headers: { authorization: `Bearer ${h.customerToken}`, 'x-test-mode': 'no-usage' },
      });
      expect(res.status).toBe(200);
      await res.text();
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'completed', usage_estimated: false, model_usage: { input_tokens: 0, output_tokens: 0 } });
      expect(parseMoney(record.total_request_cost)).toBe(0n);
    });
  });

  describe('provider errors', () => {
    it.each([
      [429, { error: { message: 'Slow down, custom.', type: 'rate_limit_error', code: 'rate_limit_exceeded', extra: [1, 2] } }],
      [400, { error: { message: "Invalid 'messages'.", type: 'invalid_request_error', param: 'messages', code: null } }],
      [400, undefined],
      [503, undefined],
    ])('relays an upstream %s unchanged, records error, releases the hold and charges nothing', async (status, errorBody) => {
      upstream.setNext({ status, ...(errorBody ? { errorBody } : {}), headers: { 'x-ratelimit-remaining-requests': '0' } });
      const customerBefore = await wallet(customer.walletId);
      const merchantBefore = await wallet(t.merchant.walletId);
      const res = await post(OPENAI_CHAT, JSON.stringify({ model: 'gpt-4o', max_tokens: 50, messages: [{ role: 'user', content: 'hi' }] }), {
        authorization: `Bearer ${h.customerToken}`,
      });
      expect(res.status).toBe(status);
      const text = await res.text();
      if (errorBody) expect(text).toBe(JSON.stringify(errorBody));
      else expect(JSON.parse(text)).toMatchObject({ error: { message: `Mock upstream error ${status}.` } });
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(res.headers.get('x-ratelimit-remaining-requests')).toBe('0');
      if (status === 429) expect(res.headers.get('retry-after')).toBe('1');
      const requestId = res.headers.get('x-tollgate-request-id');
      expect(requestId).toMatch(/^req_/);
      const record = await t.settledRecord(requestId!);
      expect(record.status).toBe('error');
      expect(parseMoney(record.total_request_cost)).toBe(0n);
      const customerAfter = await wallet(customer.walletId);
      const merchantAfter = await wallet(t.merchant.walletId);
      expect(customerAfter.balance).toBe(customerBefore.balance);
      expect(merchantAfter.balance).toBe(merchantBefore.balance);
      expect(customerAfter.held).toBe(0n);
      expect(merchantAfter.held).toBe(0n);
    });

    it('relays an Anthropic-shaped 400 unchanged', async () => {
      upstream.setNext({ status: 400 });
      const res = await post(
        `u=${encodeURIComponent('https://api.anthropic.com/v1/messages')}`,
        JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
      );
      expect(res.status).toBe(400);
      expect(await res.json()).toEqual({ type: 'error', error: { type: 'invalid_request_error', message: 'Mock upstream error 400.' } });
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).status).toBe('error');
    });
  });
});
