import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Lava } from '@lavapayments/nodejs';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

describe.each(databasesUnderTest())('forward gateway basics on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let lava: Lava;
  let customer: { customer_id: string; wallet: { wallet_id: string } };
  let meter: { meter_slug: string };

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com', 'api.anthropic.com'],
      providerKeys: { openai: 'sk-managed-openai', anthropic: 'sk-managed-anthropic' },
    }));
    lava = new Lava(t.merchant.secretKey, { baseUrl: `${base}/v1/` });
    const h = t.auth();
    customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: {} })).json();
    meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '100' }] },
      })
    ).json();
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('10'), new Date().toISOString());
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  it('forwards a chat completion for a customer, relays the exact body and charges the meter fee', async () => {
    const token = lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'one two three four' }], max_tokens: 7, extra_field: { kept: true } });
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body,
    });
    expect(res.status).toBe(200);
    const json = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
    const requestId = res.headers.get('x-tollgate-request-id')!;
    expect(requestId).toMatch(/^req_/);

    const seen = upstream.requests.at(-1)!;
    expect(seen.body.toString()).toBe(body);
    expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');

    const record = await t.settledRecord(requestId);
    const tokens = json.usage.prompt_tokens + json.usage.completion_tokens;
    expect(record).toMatchObject({
      status: 'completed',
      provider: 'openai',
      model: 'gpt-4o',
      endpoint: 'POST https://api.openai.com/v1/chat/completions',
      provider_key_type: 'managed',
      customer_id: customer.customer_id,
      model_usage: { input_tokens: json.usage.prompt_tokens, output_tokens: json.usage.completion_tokens },
    });
    // fee: tokens × 100 per 1M
    expect(parseMoney(record.fee.amount)).toBe(BigInt(tokens) * parseMoney('100') / 1_000_000n);
    expect(parseMoney(record.total_request_cost)).toBe(parseMoney(record.fee.amount) + parseMoney(record.cost));
    const wallet = await findWallet(t.storage, customer.wallet.wallet_id);
    expect(wallet!.balance).toBe(parseMoney('10') - parseMoney(record.total_wallet_cost));
    expect(wallet!.held).toBe(0n);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('refuses a host that is not a provider before any connection', async () => {
    const before = upstream.requests.length;
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://evil.example/v1/chat/completions')}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('unsupported_provider');
    expect(upstream.requests.length).toBe(before);
  });

  it('relays an upstream 500 unchanged, records error and charges nothing', async () => {
    upstream.setNext({ status: 500 });
    const walletBefore = (await findWallet(t.storage, t.merchant.walletId))!.balance;
    const res = await fetch(`${base}/v1/forward?u=https://api.openai.com/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(500);
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    expect(record.status).toBe('error');
    expect(record.total_request_cost).toBe('0.0000000000');
    const after = (await findWallet(t.storage, t.merchant.walletId))!;
    expect(after.balance).toBe(walletBefore);
    expect(after.held).toBe(0n);
  });

  it('streams a chat completion, hides the usage chunk the client did not ask for, and meters it', async () => {
    const token = lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug });
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'a b' }] }),
    });
    const text = await res.text();
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    expect(text).toContain('[DONE]');
    const events = text
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => JSON.parse(e.slice(6)) as { usage?: unknown; choices: unknown[] });
    expect(events.length).toBe(5); // role, three words, finish — and no usage-only chunk
    expect(events.filter((e) => e.usage)).toEqual([]);
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    expect(record.status).toBe('completed');
    expect(record.model_usage.output_tokens).toBe(3);
    expect(record.model_usage.input_tokens).toBeGreaterThan(0);
    expect(parseMoney(record.fee.amount)).toBeGreaterThan(0n);
  });

  describe("the record's timestamp", () => {
    // The mock's OpenAI answers say created = 1_700_000_000 (Unix seconds).
    const OPENAI_CREATED = new Date(1_700_000_000 * 1000).toISOString();

    async function forwardAndSettle(target: string, body: object) {
      const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(target)}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      await res.arrayBuffer();
      return t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    }

    it.each([
      ['a chat completion', 'https://api.openai.com/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }],
      ['a streamed chat completion', 'https://api.openai.com/v1/chat/completions', { model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }],
      ['a response', 'https://api.openai.com/v1/responses', { model: 'gpt-4o', input: 'hi' }],
      ['a streamed response', 'https://api.openai.com/v1/responses', { model: 'gpt-4o', stream: true, input: 'hi' }],
    ])('is the time the provider reports for %s', async (_name, target, body) => {
      const record = await forwardAndSettle(target, body);
      expect(record.status).toBe('completed');
      expect(record.timestamp).toBe(OPENAI_CREATED);
      expect(record.created_at).not.toBe(OPENAI_CREATED);
    });

    it('is the settlement time for a provider that reports none (Anthropic)', async () => {
      const record = await forwardAndSettle('https://api.anthropic.com/v1/messages', {
        model: 'claude-sonnet-4-5',
        max_tokens: 3,
        messages: [{ role: 'user', content: 'hi' }],
      });
      expect(record.status).toBe('completed');
      expect(Date.parse(record.timestamp)).toBeGreaterThanOrEqual(Date.parse(record.created_at));
      // The app's clock stood still since the call: its settlement is stamped with that instant.
      expect(Date.parse(record.timestamp)).toBe(t.clock.now());
    });
  });
});
