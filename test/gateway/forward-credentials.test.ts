import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream, RecordedRequest } from '../helpers/mock-upstream.ts';

/**
 * Forward-gateway credentials over real HTTP: every placement (Authorization Bearer, x-api-key,
 * x-goog-api-key, xi-api-key, query `key`) with a raw secret key and with a forward token, every
 * forward-token shape, and the refusals. Our credential must never reach the provider; the
 * caller's own provider_key must, in the provider's own header style.
 */

const b64 = (value: unknown): string => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64');

const MANAGED = {
  openai: 'sk-managed-openai',
  anthropic: 'sk-managed-anthropic',
  google: 'managed-google-key',
  elevenlabs: 'managed-elevenlabs-key',
  mistral: 'managed-mistral-key',
};
const CREDENTIAL_HEADER_NAMES = ['authorization', 'x-api-key', 'x-goog-api-key', 'xi-api-key'] as const;

const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const ANTHROPIC_MESSAGES = 'https://api.anthropic.com/v1/messages';
const GEMINI = 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:generateContent';
const GEMINI_STREAM = 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:streamGenerateContent';
const ELEVENLABS_MODELS = 'https://api.elevenlabs.io/v1/models';

const chatBody = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello there friend' }], max_tokens: 4 });
const anthropicBody = JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'hi there' }] });
const geminiBody = JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'one two three' }] }], generationConfig: { maxOutputTokens: 3 } });

type Envelope = { error: { code: string; status: number; message: string } };
type Placement = 'authorization' | 'x-api-key' | 'x-goog-api-key' | 'xi-api-key';

describe.each(databasesUnderTest())('forward gateway credentials on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let customer: { customer_id: string; connection_secret: string; wallet: { wallet_id: string } };
  let meter: { meter_id: string; meter_slug: string; product_secret: string };
  let strangerCustomer: { customer_id: string };

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com', 'api.anthropic.com', 'generativelanguage.googleapis.com', 'api.elevenlabs.io', 'api.mistral.ai', 'api.x.ai'],
      providerKeys: MANAGED,
    }));
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
    const stranger = await t.newMerchant('Stranger');
    strangerCustomer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(stranger.secretKey), payload: {} })).json();
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('10'), new Date().toISOString());
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const balance = async (walletId: string) => (await findWallet(t.storage, walletId))!;

  function post(query: string, headers: Record<string, string>, body = chatBody): Promise<Response> {
    return fetch(`${base}/v1/forward?${query}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  }
  const encoded = (target: string) => `u=${encodeURIComponent(target)}`;

  /** The request the mock saw last, after checking it saw exactly `count` new ones since `before`. */
  function onlyNewRequest(before: number): RecordedRequest {
    expect(upstream.requests.length).toBe(before + 1);
    return upstream.requests.at(-1)!;
  }

  /** None of `secrets` appears anywhere in what the provider received (headers, URL, body). */
  function expectNoLeak(seen: RecordedRequest, ...secrets: string[]) {
    const everything = JSON.stringify(seen.headers) + seen.url + seen.body.toString('utf8');
    for (const secret of secrets) {
      expect(everything).not.toContain(secret);
      expect(everything).not.toContain(encodeURIComponent(secret));
    }
  }

  function headerFor(placement: Placement, credential: string): Record<string, string> {
    return { [placement]: placement === 'authorization' ? `Bearer ${credential}` : credential };
  }

  const customerToken = () => b64({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug });

  const credentialKinds = [
    ['a raw secret key', () => t.merchant.secretKey, () => null],
    ['a forward token', customerToken, () => customer.customer_id],
  ] as const;

  describe.each(credentialKinds)('with %s', (_name, credentialOf, expectedCustomer) => {
    it.each(['authorization', 'x-api-key', 'x-goog-api-key', 'xi-api-key'] as const)(
      'accepts the credential in %s, strips it, and sends the managed key in the provider style',
      async (placement) => {
        const credential = credentialOf();
        const before = upstream.requests.length;
        const res = await post(encoded(OPENAI_CHAT), headerFor(placement, credential));
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        const seen = onlyNewRequest(before);
        expect(seen.headers.authorization).toBe(`Bearer ${MANAGED.openai}`);
        for (const name of CREDENTIAL_HEADER_NAMES.filter((n) => n !== 'authorization')) expect(seen.headers[name]).toBeUndefined();
        expectNoLeak(seen, credential, t.merchant.secretKey);
        const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
        expect(record).toMatchObject({ status: 'completed', provider: 'openai', provider_key_type: 'managed', customer_id: expectedCustomer() });
      },
    );

    it.each([
      ['inside a raw u', (cred: string) => `u=${GEMINI}?key=${encodeURIComponent(cred)}`],
      ['inside an encoded u', (cred: string) => encoded(`${GEMINI}?key=${encodeURIComponent(cred)}`)],
      ['beside an encoded u', (cred: string) => `${encoded(GEMINI)}&key=${encodeURIComponent(cred)}`],
      ['before a raw u', (cred: string) => `key=${encodeURIComponent(cred)}&u=${GEMINI}`],
    ])('accepts the query key %s on a Google target and removes it from the upstream URL', async (_where, queryOf) => {
      const credential = credentialOf();
      const before = upstream.requests.length;
      const res = await post(queryOf(credential), {}, geminiBody);
      expect(res.status).toBe(200);
      const json = (await res.json()) as { usageMetadata: { candidatesTokenCount: number } };
      expect(json.usageMetadata.candidatesTokenCount).toBe(3);
      const seen = onlyNewRequest(before);
      expect(seen.path).toBe('/v1beta/models/gemini-2.0-flash:generateContent');
      expect(seen.query.has('key')).toBe(false);
      expect(seen.url).not.toContain('key=');
      expect(seen.headers['x-goog-api-key']).toBe(MANAGED.google);
      expect(seen.headers.authorization).toBeUndefined();
      expectNoLeak(seen, credential, t.merchant.secretKey);
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'completed', provider: 'google', customer_id: expectedCustomer() });
      expect(record.endpoint).not.toContain('key=');
    });
  });

  it('keeps the other query parameters of a Google streaming target when it removes key', async () => {
    const before = upstream.requests.length;
    const res = await post(`u=${GEMINI_STREAM}?alt=sse&key=${encodeURIComponent(t.merchant.secretKey)}&x=1`, {}, geminiBody);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    await res.text();
    const seen = onlyNewRequest(before);
    expect(seen.url).toBe('/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse&x=1');
    expectNoLeak(seen, t.merchant.secretKey);
  });

  it('accepts a token in the URL-safe base64 alphabet without padding', async () => {
    const token = Buffer.from(JSON.stringify({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug, pad: '??>>' }))
      .toString('base64url');
    const before = upstream.requests.length;
    const res = await post(encoded(OPENAI_CHAT), { authorization: `Bearer ${token}` });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expectNoLeak(onlyNewRequest(before), token, t.merchant.secretKey);
    expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).customer_id).toBe(customer.customer_id);
  });

  describe('token shapes', () => {
    async function forwardWith(token: string, target = OPENAI_CHAT, body = chatBody) {
      const before = upstream.requests.length;
      const res = await post(encoded(target), { authorization: `Bearer ${token}` }, body);
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const seen = onlyNewRequest(before);
      expectNoLeak(seen, token, t.merchant.secretKey);
      return { seen, record: await t.settledRecord(res.headers.get('x-tollgate-request-id')!) };
    }

    it('older connection_secret + product_secret: the customer pays per the meter', async () => {
      const customerBefore = (await balance(customer.wallet.wallet_id)).balance;
      const merchantBefore = (await balance(t.merchant.walletId)).balance;
      const { record } = await forwardWith(
        b64({ secret_key: t.merchant.secretKey, connection_secret: customer.connection_secret, product_secret: meter.product_secret, provider_key: null }),
      );
      expect(record).toMatchObject({ status: 'completed', customer_id: customer.customer_id, meter_id: meter.meter_id, provider_key_type: 'managed' });
      expect(parseMoney(record.fee.amount)).toBeGreaterThan(0n);
      expect(customerBefore - (await balance(customer.wallet.wallet_id)).balance).toBe(parseMoney(record.total_wallet_cost));
      expect((await balance(t.merchant.walletId)).balance).toBe(merchantBefore);
    });

    it('older product_secret alone: meter-only, the merchant pays', async () => {
      const customerBefore = (await balance(customer.wallet.wallet_id)).balance;
      const merchantBefore = (await balance(t.merchant.walletId)).balance;
      const { record } = await forwardWith(b64({ secret_key: t.merchant.secretKey, product_secret: meter.product_secret }));
      expect(record).toMatchObject({ status: 'completed', customer_id: null, meter_id: meter.meter_id });
      expect(parseMoney(record.fee.amount)).toBeGreaterThan(0n);
      const charged = parseMoney(record.total_wallet_cost) + parseMoney(record.total_merchant_cost);
      expect(charged).toBeGreaterThan(0n);
      expect(merchantBefore - (await balance(t.merchant.walletId)).balance).toBe(charged);
      expect((await balance(customer.wallet.wallet_id)).balance).toBe(customerBefore);
    });

    it.each(['customer_id', 'connection_id'] as const)('newer %s + meter_slug: the customer pays per the meter', async (member) => {
      const customerBefore = (await balance(customer.wallet.wallet_id)).balance;
      const { record } = await forwardWith(b64({ secret_key: t.merchant.secretKey, [member]: customer.customer_id, meter_slug: meter.meter_slug }));
      expect(record).toMatchObject({ status: 'completed', customer_id: customer.customer_id, meter_id: meter.meter_id });
      expect(parseMoney(record.total_wallet_cost)).toBeGreaterThan(0n);
      expect(customerBefore - (await balance(customer.wallet.wallet_id)).balance).toBe(parseMoney(record.total_wallet_cost));
    });

    it('meter_slug only: meter-only, the merchant pays', async () => {
      const customerBefore = (await balance(customer.wallet.wallet_id)).balance;
      const merchantBefore = (await balance(t.merchant.walletId)).balance;
      const { record } = await forwardWith(b64({ secret_key: t.merchant.secretKey, meter_slug: meter.meter_slug, customer_id: null }));
      expect(record).toMatchObject({ status: 'completed', customer_id: null, meter_id: meter.meter_id });
      expect(parseMoney(record.fee.amount)).toBeGreaterThan(0n);
      expect(merchantBefore - (await balance(t.merchant.walletId)).balance).toBe(
        parseMoney(record.total_wallet_cost) + parseMoney(record.total_merchant_cost),
      );
      expect((await balance(customer.wallet.wallet_id)).balance).toBe(customerBefore);
    });

    it.each([
      ['secret_key alone', () => ({ secret_key: t.merchant.secretKey })],
      [
        'every other member null',
        () => ({
          secret_key: t.merchant.secretKey,
          connection_secret: null,
          product_secret: null,
          connection_id: null,
          customer_id: null,
          meter_slug: null,
          provider_key: null,
          disable_billing: null,
        }),
      ],
      ['disable_billing false', () => ({ secret_key: t.merchant.secretKey, disable_billing: false })],
    ])('merchant-only (%s): the merchant pays the base cost, no fee', async (_name, tokenOf) => {
      const merchantBefore = (await balance(t.merchant.walletId)).balance;
      const { seen, record } = await forwardWith(b64(tokenOf()));
      expect(seen.headers.authorization).toBe(`Bearer ${MANAGED.openai}`);
      expect(record).toMatchObject({ status: 'completed', customer_id: null, meter_id: null, provider_key_type: 'managed' });
      expect(parseMoney(record.fee.amount)).toBe(0n);
      expect(parseMoney(record.cost)).toBeGreaterThan(0n);
      expect(merchantBefore - (await balance(t.merchant.walletId)).balance).toBe(parseMoney(record.cost));
    });

    it.each([
      ['OpenAI', OPENAI_CHAT, chatBody, 'authorization', 'Bearer '],
      ['Anthropic', ANTHROPIC_MESSAGES, anthropicBody, 'x-api-key', ''],
      ['Google', GEMINI, geminiBody, 'x-goog-api-key', ''],
    ] as const)('provider_key (unmanaged) reaches %s in its own header style; nothing is charged', async (_name, target, body, header, prefix) => {
      const merchantBefore = (await balance(t.merchant.walletId)).balance;
      const { seen, record } = await forwardWith(b64({ secret_key: t.merchant.secretKey, provider_key: 'users-own-provider-key' }), target, body);
      expect(seen.headers[header]).toBe(`${prefix}users-own-provider-key`);
      for (const name of CREDENTIAL_HEADER_NAMES.filter((n) => n !== header)) expect(seen.headers[name]).toBeUndefined();
      expect(JSON.stringify(seen.headers)).not.toContain('managed');
      expect(record).toMatchObject({ status: 'completed', provider_key_type: 'unmanaged', customer_id: null });
      expect(record.model_usage.input_tokens).toBeGreaterThan(0);
      expect(parseMoney(record.total_request_cost)).toBe(0n);
      expect((await balance(t.merchant.walletId)).balance).toBe(merchantBefore);
    });

    it('provider_key reaches ElevenLabs as xi-api-key (GET)', async () => {
      const token = b64({ secret_key: t.merchant.secretKey, provider_key: 'users-own-eleven-key' });
      const before = upstream.requests.length;
      const res = await fetch(`${base}/v1/forward?${encoded(ELEVENLABS_MODELS)}`, { headers: { 'xi-api-key': token } });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const seen = onlyNewRequest(before);
      expect(seen.method).toBe('GET');
      expect(seen.headers['xi-api-key']).toBe('users-own-eleven-key');
      expect(seen.headers.authorization).toBeUndefined();
      expectNoLeak(seen, token, t.merchant.secretKey);
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).provider_key_type).toBe('unmanaged');
    });

    it('provider_key together with a customer and meter: the fee is charged, the base cost is not', async () => {
      const customerBefore = (await balance(customer.wallet.wallet_id)).balance;
      const { seen, record } = await forwardWith(
        b64({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug, provider_key: 'byok-key' }),
      );
      expect(seen.headers.authorization).toBe('Bearer byok-key');
      expect(record).toMatchObject({ status: 'completed', provider_key_type: 'unmanaged', customer_id: customer.customer_id });
      expect(parseMoney(record.fee.amount)).toBeGreaterThan(0n);
      expect(parseMoney(record.total_wallet_cost)).toBe(parseMoney(record.fee.amount) + parseMoney(record.service_charge.amount));
      expect(customerBefore - (await balance(customer.wallet.wallet_id)).balance).toBe(parseMoney(record.total_wallet_cost));
    });

    it('disable_billing: recorded for the customer and meter, the customer is not charged, the merchant pays the base cost', async () => {
      const customerBefore = (await balance(customer.wallet.wallet_id)).balance;
      const merchantBefore = (await balance(t.merchant.walletId)).balance;
      const { record } = await forwardWith(
        b64({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug, disable_billing: true }),
      );
      expect(record).toMatchObject({ status: 'completed', customer_id: customer.customer_id, meter_id: meter.meter_id });
      expect(parseMoney(record.fee.amount)).toBe(0n);
      expect(parseMoney(record.total_wallet_cost)).toBe(0n);
      expect((await balance(customer.wallet.wallet_id)).balance).toBe(customerBefore);
      expect(parseMoney(record.cost)).toBeGreaterThan(0n);
      expect(merchantBefore - (await balance(t.merchant.walletId)).balance).toBe(parseMoney(record.cost));
    });

    it('leaves the ledger balanced and no hold behind', async () => {
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
      expect((await balance(t.merchant.walletId)).held).toBe(0n);
      expect((await balance(customer.wallet.wallet_id)).held).toBe(0n);
    });
  });

  describe('refusals, before any provider call', () => {
    /** The interface's code: Gemini-shaped refusals carry it as their ErrorInfo reason (decision 0021). */
    function interfaceCode(body: unknown): string {
      const error = (body as Envelope & { error: { details?: { reason?: string }[] } }).error;
      return error.details?.[0]?.reason ?? error.code;
    }

    async function refused(headers: Record<string, string>, query = encoded(OPENAI_CHAT)): Promise<{ status: number; code: string; text: string }> {
      const before = upstream.requests.length;
      const res = await post(query, headers);
      const text = await res.text();
      expect(upstream.requests.length).toBe(before);
      return { status: res.status, code: interfaceCode(JSON.parse(text)), text };
    }

    it.each([
      ['not base64', '!!!not-base64!!!'],
      ['base64 of text that is not JSON', b64('this is not json')],
      ['base64 of a JSON array', b64('[1,2,3]')],
      ['base64 of a JSON string', b64('"sk_live_abc"')],
      ['base64 of invalid UTF-8', Buffer.from([0xff, 0xfe, 0x7b, 0x7d]).toString('base64')],
      ['a token without secret_key', b64({ customer_id: 'cus_x', meter_slug: 'chat' })],
      ['a member of the wrong type', b64({ secret_key: 42 })],
      ['disable_billing of the wrong type', b64({ secret_key: 'sk_live_x', disable_billing: 'yes' })],
      ['bad padding', `${b64({ secret_key: 'sk_live_x' }).replace(/=+$/, '')}A=`],
    ])('%s → 400 forward_token_json_invalid', async (_name, token) => {
      for (const placement of ['authorization', 'x-api-key'] as const) {
        const { status, code, text } = await refused(headerFor(placement, token));
        expect(status).toBe(400);
        expect(code).toBe('forward_token_json_invalid');
        expect(text).not.toContain(token);
      }
    });

    it('a combination no client may send → 400 forward_token_invalid', async () => {
      const cases = [
        { secret_key: t.merchant.secretKey, customer_id: customer.customer_id },
        { secret_key: t.merchant.secretKey, connection_secret: customer.connection_secret },
        { secret_key: t.merchant.secretKey, connection_secret: customer.connection_secret, product_secret: meter.product_secret, meter_slug: meter.meter_slug },
      ];
      for (const token of cases) {
        const { status, code } = await refused({ authorization: `Bearer ${b64(token)}` });
        expect([status, code]).toEqual([400, 'forward_token_invalid']);
      }
    });

    it.each([
      ['an unknown raw secret key', () => 'sk_live_thiskeydoesnotexist0000000000'],
      ['a token with an unknown secret_key', () => b64({ secret_key: 'sk_live_thiskeydoesnotexist0000000000' })],
      ['a token with an unknown customer', () => b64({ secret_key: t.merchant.secretKey, customer_id: 'cus_nope', meter_slug: meter.meter_slug })],
      ['a token with another merchant’s customer', () => b64({ secret_key: t.merchant.secretKey, customer_id: strangerCustomer.customer_id, meter_slug: meter.meter_slug })],
      ['a token with an unknown meter_slug', () => b64({ secret_key: t.merchant.secretKey, meter_slug: 'no-such-meter' })],
      ['a token with a wrong connection_secret', () => b64({ secret_key: t.merchant.secretKey, connection_secret: 'cons_wrong', product_secret: meter.product_secret })],
    ])('%s → 401', async (_name, tokenOf) => {
      for (const placement of ['authorization', 'x-goog-api-key', 'xi-api-key'] as const) {
        const { status, code } = await refused(headerFor(placement, tokenOf()));
        expect([status, code]).toEqual([401, 'unauthorized']);
      }
      const { status, code } = await refused({}, `u=${GEMINI}?key=${encodeURIComponent(tokenOf())}`);
      expect([status, code]).toEqual([401, 'unauthorized']);
    });

    it.each([
      ['no credential at all', {}],
      ['an empty Bearer', { authorization: 'Bearer ' }],
      ['Basic authorization', { authorization: `Basic ${Buffer.from('user:pass').toString('base64')}` }],
      ['empty key headers', { 'x-api-key': '', 'x-goog-api-key': '  ' }],
    ])('%s → 401', async (_name, headers) => {
      const { status, code } = await refused(headers as Record<string, string>);
      expect([status, code]).toEqual([401, 'unauthorized']);
    });

    it('an empty query key → 401', async () => {
      const { status, code } = await refused({}, `u=${GEMINI}?key=`);
      expect([status, code]).toEqual([401, 'unauthorized']);
    });

    it('a provider without a managed key and no provider_key → 400 provider_key_missing', async () => {
      const { status, code } = await refused({ authorization: `Bearer ${t.merchant.secretKey}` }, encoded('https://api.x.ai/v1/chat/completions'));
      expect([status, code]).toEqual([400, 'provider_key_missing']);
    });
  });
});
