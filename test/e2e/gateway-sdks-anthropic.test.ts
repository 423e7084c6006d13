import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { findWallet } from '../../src/ledger/wallets.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { normalise, sseData, useSdkGateway, type RecordJson } from '../helpers/sdk-gateway.ts';

/**
 * @anthropic-ai/sdk 1 drives the forward gateway over real HTTP (see sdk-gateway.ts for the
 * billing modes and the hand-worked costs): messages.create with the token in x-api-key or as
 * apiKey, messages.stream, a caller's own provider key, and a provider's 429.
 *
 * How the client is pointed at the gateway: `baseURL: lava.providers.anthropic` or
 * `<base>/v1/forward?u=https://api.anthropic.com`; the client appends `/v1/messages` to the
 * string, and the doubled `/v1/v1` of the published base is collapsed by the Anthropic provider
 * module. In 1.x `apiKey` goes out as `Authorization: Bearer` (not x-api-key); to send the token
 * in x-api-key, pass `apiKey: null, defaultHeaders: {'x-api-key': token}`.
 */

describe.each(databasesUnderTest())('official SDKs through the forward gateway on %s', (dialect) => {
  const h = useSdkGateway(dialect);
  const { upstream, t, lava, customer, customerToken, balances, direct, lastUpstream, expectBilled, expectNoTollgateCredential } = h;

  describe('@anthropic-ai/sdk client', () => {
    const anthropicBase = () => `${h.base}/v1/forward?u=https://api.anthropic.com`;
    /** The token in x-api-key: 1.x sends `apiKey` as Authorization: Bearer, so it goes as a default header. */
    const viaXApiKey = (token: string) =>
      new Anthropic({ apiKey: null, authToken: null, defaultHeaders: { 'x-api-key': token }, baseURL: anthropicBase(), maxRetries: 0 });

    it('messages.create with the forward token in x-api-key: the exact message; customer pays', async () => {
      const token = customerToken();
      const before = await balances();
      const { data, response } = await viaXApiKey(token)
        .messages.create({
          model: 'claude-haiku-4-5',
          max_tokens: 6,
          system: 'be brief',
          messages: [{ role: 'user', content: 'hello from the sdk' }],
        })
        .withResponse();

      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/messages');
      expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
      expect(seen.headers.authorization).toBeUndefined();
      expect(seen.headers['anthropic-version']).toBeTruthy(); // the client's, passed through
      expectNoTollgateCredential(seen, token);
      const provided = JSON.parse((await direct(seen)).text) as unknown;
      expect(normalise(data)).toEqual(normalise(provided));
      expect(data.content).toEqual([{ type: 'text', text: 'tok tok tok tok tok tok' }]);
      expect(data.usage).toMatchObject({ input_tokens: 6, output_tokens: 6 });

      const record = await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 6,
        outputTokens: 6,
        customerId: customer.customer_id,
        // base 6 × 1/1M + 6 × 5/1M = 0.000036; fee 12 × 100/1M = 0.0012
        totalRequestCost: '0.0012360000',
      });
      expect(record.response_id).toBe(data.id);
    });

    it('messages.create with apiKey (sent as Authorization: Bearer) works the same', async () => {
      const token = customerToken();
      const before = await balances();
      const client = new Anthropic({ apiKey: token, baseURL: anthropicBase(), maxRetries: 0 });
      const { data, response } = await client.messages
        .create({ model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'x y' }] })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
      expect(seen.headers.authorization).toBeUndefined();
      expectNoTollgateCredential(seen, token);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 2,
        outputTokens: 2,
        // base 2/1M + 10/1M = 0.000012; fee 4 × 100/1M = 0.0004
        totalRequestCost: '0.0004120000',
      });
    });

    it('messages.stream: every event the provider sent, the final message, exact billing', async () => {
      const token = customerToken();
      const before = await balances();
      const stream = viaXApiKey(token).messages.stream({
        model: 'claude-haiku-4-5',
        max_tokens: 4,
        messages: [{ role: 'user', content: 'stream me four' }],
      });
      // Copied as they arrive: the stream's accumulator later mutates message_start's message in place.
      const events: unknown[] = [];
      stream.on('streamEvent', (event) => events.push(structuredClone(event)));
      const { response } = await stream.withResponse();
      const message = await stream.finalMessage();

      const seen = lastUpstream();
      expect(seen.body.toString()).toContain('"stream":true');
      const answer = await direct(seen);
      expect(answer.contentType).toContain('text/event-stream');
      // The client drops `ping` events by design; everything else is the provider's, in order.
      const provided = sseData(answer.text).filter((e) => (e as { type: string }).type !== 'ping');
      expect(normalise(events)).toEqual(normalise(provided));
      expect(message.content).toEqual([{ type: 'text', text: 'tok tok tok tok' }]);
      expect(message.usage).toMatchObject({ input_tokens: 3, output_tokens: 4 });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 3,
        outputTokens: 4,
        // base 3/1M + 20/1M = 0.000023; fee 7 × 100/1M = 0.0007
        totalRequestCost: '0.0007230000',
      });
    });

    it('unmanaged: provider_key reaches Anthropic in x-api-key; base cost not charged, nothing at all without a meter', async () => {
      const token = lava.generateForwardToken({ customer_id: null, meter_slug: null, provider_key: 'sk-ant-caller' });
      const before = await balances();
      const { data, response } = await viaXApiKey(token)
        .messages.create({ model: 'claude-haiku-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'my own key' }] })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers['x-api-key']).toBe('sk-ant-caller');
      expect(seen.headers.authorization).toBeUndefined();
      expectNoTollgateCredential(seen, token);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'merchant_unmanaged',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 3,
        outputTokens: 3,
        customerId: null,
        meterId: null,
        totalRequestCost: '0.0000000000',
      });
    });

    it("an upstream 429 reaches the client as the provider's own error; recorded as error, nothing charged", async () => {
      const token = customerToken();
      const before = await balances();
      upstream.setNext({ status: 429, path: '/messages' });
      const error = await viaXApiKey(token)
        .messages.create({ model: 'claude-haiku-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'too many' }] })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(error).toBeInstanceOf(Anthropic.RateLimitError);
      const apiError = error as InstanceType<typeof Anthropic.RateLimitError>;
      expect(apiError.error).toEqual({ type: 'error', error: { type: 'rate_limit_error', message: 'Mock upstream error 429.' } });
      expect(apiError.headers.get('retry-after')).toBe('1');
      const record: RecordJson = await t.settledRecord(apiError.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'error', total_request_cost: '0.0000000000', fee: { amount: '0.0000000000' } });
      const after = await balances();
      expect(after).toEqual(before);
      expect((await findWallet(t.storage, customer.walletId))!.held).toBe(0n);
    });
  });
});
