import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest, priceOverridesFile } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * The operator's price for a Google model applies wherever that model is served from Google's
 * account: the native Gemini API and its OpenAI-compatible path (recorded as `google-openai`).
 * The override (3 in / 7 out per 1M) is far from the catalog's gemini-2.0-flash price (0.1 / 0.4).
 */
const OVERRIDES = { 'google/gemini-2.0-flash': { input: '3', output: '7' } };

describe.each(databasesUnderTest())('Google price overrides on the OpenAI-compatible path on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['generativelanguage.googleapis.com'],
      providerKeys: { google: 'google-managed' },
      env: { PRICE_OVERRIDES_FILE: priceOverridesFile(OVERRIDES) },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const merchantBalance = async () => (await findWallet(t.storage, t.merchant.walletId))!.balance;
  // 4 prompt words, 6 output tokens: 4 × 3 + 6 × 7 = 54 per 1M.
  const request = { model: 'gemini-2.0-flash', messages: [{ role: 'user' as const, content: 'one two three four' }], max_tokens: 6 };

  it('a drop-in chat completion for a Gemini model is priced by the google/… override', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1`, maxRetries: 0 });
    const before = await merchantBalance();
    const { response } = await openai.chat.completions.create(request).withResponse();
    expect(upstream.requests.at(-1)!.path).toBe('/v1beta/openai/chat/completions');
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ provider: 'google-openai', model: 'gemini-2.0-flash' });
    expect(record.model_usage).toMatchObject({ input_cost: '0.0000120000', output_cost: '0.0000420000', total_cost: '0.0000540000' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.000054'));
  });

  it('a forwarded call to /v1beta/openai is priced by the google/… override', async () => {
    const target = 'https://generativelanguage.googleapis.com/v1beta/openai';
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1/forward?u=${target}`, maxRetries: 0 });
    const before = await merchantBalance();
    const { response } = await openai.chat.completions.create(request).withResponse();
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ provider: 'google-openai', endpoint: `POST ${target}/chat/completions`, cost: '0.0000540000' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.000054'));
  });

  it('POST /v1/requests naming google-openai is priced by the google/… override', async () => {
    const post = (url: string, payload: object) => t.app.inject({ method: 'POST', url, headers: t.auth(), payload });
    const meter = (await post('/v1/meters', { name: 'Free', rate_type: 'fixed', tiers: [{ start: '0', rate: '0' }] })).json();
    const customer = (await post('/v1/customers', { name: 'Gemini user' })).json();
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('1'), new Date().toISOString());
    const res = await post('/v1/requests', {
      request_id: 'gemini-compat-1',
      customer_id: customer.customer_id,
      meter_slug: meter.meter_slug,
      provider: 'google-openai',
      model: 'gemini-2.0-flash',
      input_tokens: 4,
      output_tokens: 6,
    });
    expect(res.statusCode).toBe(201);
    expect(res.json()).toMatchObject({ cost: '0.0000540000' });
  });
});
