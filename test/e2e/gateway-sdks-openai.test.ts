import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { findWallet } from '../../src/ledger/wallets.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { normalise, sseData, useSdkGateway } from '../helpers/sdk-gateway.ts';

/**
 * openai 7 drives the forward gateway over real HTTP (see sdk-gateway.ts for the billing modes and
 * the hand-worked costs): chat completions (JSON and streams, with and without include_usage),
 * embeddings, responses (JSON and streams), merchant mode, a caller's own provider key, and a 402.
 *
 * How the client is pointed at the gateway: `baseURL: lava.providers.openai`
 * (`<base>/v1/forward?u=https://api.openai.com/v1`, raw u). The client appends its path to the
 * base URL's PATH and re-serialises the query, so the server receives
 * `/v1/forward/chat/completions?u=<percent-encoded base>`; the gateway joins the two. The client's
 * own query parameters (e.g. `files.list({limit})`) stand beside `u` and are passed on to the
 * provider.
 */

const isUsageOnlyChunk = (chunk: unknown): boolean => {
  const c = chunk as { choices?: unknown[]; usage?: unknown };
  return Array.isArray(c.choices) && c.choices.length === 0 && c.usage !== null && typeof c.usage === 'object';
};

describe.each(databasesUnderTest())('official SDKs through the forward gateway on %s', (dialect) => {
  const h = useSdkGateway(dialect);
  const { upstream, t, lava, meter, customer, customerToken, balances, direct, lastUpstream, expectBilled, expectNoTollgateCredential } = h;

  describe('openai client', () => {
    const openaiClient = (apiKey: string, extra: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
      new OpenAI({ apiKey, baseURL: lava.providers.openai, maxRetries: 0, ...extra });

    it('builds a forward URL the gateway joins from a baseURL with ?u=', () => {
      expect(lava.providers.openai).toBe(`${h.base}/v1/forward?u=https://api.openai.com/v1`);
      const client = openaiClient('x');
      // openai 7 appends its path to the base URL's path and re-encodes the query: the gateway
      // joins /chat/completions to the base named by u.
      expect(client.buildURL('/chat/completions', undefined)).toBe(
        `${h.base}/v1/forward/chat/completions?u=${encodeURIComponent('https://api.openai.com/v1')}`,
      );
      // Its own query parameters stand beside u: the gateway passes them on to the provider.
      expect(client.buildURL('/files', { limit: 2 })).toBe(`${h.base}/v1/forward/files?u=${encodeURIComponent('https://api.openai.com/v1')}&limit=2`);
    });

    it('chat.completions.create: the exact provider answer; customer pays fee + base', async () => {
      const token = customerToken();
      const openai = openaiClient(token, { defaultHeaders: { 'x-service-metadata': JSON.stringify({ feature: 'sdk-chat' }) } });
      const before = await balances();
      const { data, response } = await openai.chat.completions
        .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'one two three four' }], max_tokens: 7 })
        .withResponse();

      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/chat/completions');
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expect(seen.headers['x-service-metadata']).toBeUndefined();
      expectNoTollgateCredential(seen, token);
      const answer = await direct(seen);
      expect(normalise(data)).toEqual(normalise(JSON.parse(answer.text)));
      expect(data.choices[0]!.message.content).toBe('tok tok tok tok tok tok tok');
      expect(data.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: 7, total_tokens: 11 });

      const requestId = response.headers.get('x-tollgate-request-id')!;
      // base 4 × 1/1M + 7 × 2/1M = 0.000018; fee 11 × 100/1M = 0.0011
      const record = await expectBilled(requestId, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 7,
        customerId: customer.customer_id,
        meterId: meter.meter_id,
        totalRequestCost: '0.0011180000',
      });
      expect(record).toMatchObject({
        endpoint: 'POST https://api.openai.com/v1/chat/completions',
        response_id: data.id,
        metadata: { feature: 'sdk-chat' },
        total_wallet_cost: '0.0011180000',
        total_merchant_cost: '0.0000000000',
      });
    });

    it('streams without include_usage: the client gets every chunk but the usage one; billing is exact', async () => {
      const token = customerToken();
      const before = await balances();
      const { data: stream, response } = await openaiClient(token)
        .chat.completions.create({ model: 'gpt-4o', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'a b c d e' }] })
        .withResponse();
      const chunks: unknown[] = [];
      for await (const chunk of stream) chunks.push(chunk);

      const seen = lastUpstream();
      // The gateway asked for usage on the client's behalf …
      expect((seen.json as { stream_options?: unknown }).stream_options).toEqual({ include_usage: true });
      const answer = await direct(seen);
      expect(answer.contentType).toContain('text/event-stream');
      const provided = sseData(answer.text);
      expect(provided.filter(isUsageOnlyChunk)).toHaveLength(1);
      // … and hid exactly that chunk, and the `usage: null` its request added to the others:
      // everything else arrives as the provider sent it.
      const withoutNullUsage = (c: unknown) => {
        const { usage, ...rest } = c as { usage?: unknown };
        return usage === null ? rest : c;
      };
      expect(normalise(chunks)).toEqual(normalise(provided.filter((c) => !isUsageOnlyChunk(c)).map(withoutNullUsage)));
      expect(chunks.some((c) => 'usage' in (c as object))).toBe(false);
      expect(chunks).toHaveLength(5); // role, three words, finish
      expect(chunks.some(isUsageOnlyChunk)).toBe(false);

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 5,
        outputTokens: 3,
        customerId: customer.customer_id,
        // base 5 × 1/1M + 3 × 2/1M = 0.000011; fee 8 × 100/1M = 0.0008
        totalRequestCost: '0.0008110000',
      });
    });

    it('streams with include_usage: the client sees the usage chunk, untouched', async () => {
      const token = customerToken();
      const before = await balances();
      const body = {
        model: 'gpt-4o',
        stream: true as const,
        stream_options: { include_usage: true },
        max_tokens: 2,
        messages: [{ role: 'user' as const, content: 'count these three' }],
      };
      const { data: stream, response } = await openaiClient(token).chat.completions.create(body).withResponse();
      const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
      for await (const chunk of stream) chunks.push(chunk);

      const seen = lastUpstream();
      expect(seen.body.toString()).toBe(JSON.stringify(body)); // nothing to add: passed through byte for byte
      const provided = sseData((await direct(seen)).text);
      expect(normalise(chunks)).toEqual(normalise(provided));
      expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 3,
        outputTokens: 2,
        // base 3/1M + 4/1M = 0.000007; fee 5 × 100/1M = 0.0005
        totalRequestCost: '0.0005070000',
      });
    });

    it('embeddings.create: the exact vectors; input tokens only', async () => {
      const token = customerToken();
      const before = await balances();
      const { data, response } = await openaiClient(token)
        .embeddings.create({ model: 'text-embedding-3-small', input: ['alpha beta', 'gamma delta epsilon'], encoding_format: 'float' })
        .withResponse();
      const answer = await direct(lastUpstream());
      expect(data).toEqual(JSON.parse(answer.text));
      expect(data.data.map((d) => d.embedding)).toEqual([
        [0.1, 0.2, 0.3],
        [0.1, 0.2, 0.3],
      ]);
      expect(data.usage).toEqual({ prompt_tokens: 5, total_tokens: 5 });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/text-embedding-3-small',
        inputTokens: 5,
        outputTokens: 0,
        // base 5 × 0.5/1M = 0.0000025; fee 5 × 100/1M = 0.0005
        totalRequestCost: '0.0005025000',
      });
    });

    it('responses.create: the exact response object', async () => {
      const token = customerToken();
      const before = await balances();
      const { data, response } = await openaiClient(token)
        .responses.create({ model: 'gpt-4o', input: 'say six words please', max_output_tokens: 6 })
        .withResponse();
      const answer = await direct(lastUpstream());
      const provided = JSON.parse(answer.text) as Record<string, unknown>;
      // The client adds the convenience getter output_text; everything else is the provider's.
      const { output_text: outputText, ...rest } = data as typeof data & Record<string, unknown>;
      expect(outputText).toBe('tok tok tok tok tok tok');
      expect(normalise(rest)).toEqual(normalise(provided));
      expect(data.usage).toMatchObject({ input_tokens: 4, output_tokens: 6, total_tokens: 10 });

      const record = await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 6,
        // base 4/1M + 12/1M = 0.000016; fee 10 × 100/1M = 0.001
        totalRequestCost: '0.0010160000',
      });
      expect(record.response_id).toBe(data.id);
    });

    it('responses.create streaming: every event the provider sent; usage from response.completed', async () => {
      const token = customerToken();
      const before = await balances();
      const { data: stream, response } = await openaiClient(token)
        .responses.create({ model: 'gpt-4o', input: 'two words', max_output_tokens: 4, stream: true })
        .withResponse();
      const events: unknown[] = [];
      for await (const event of stream) events.push(event);
      const seen = lastUpstream();
      expect((seen.json as Record<string, unknown>).stream_options).toBeUndefined(); // only chat/completions get it
      const provided = sseData((await direct(seen)).text);
      expect(normalise(events)).toEqual(normalise(provided));
      expect(events.at(-1)).toMatchObject({ type: 'response.completed', response: { usage: { input_tokens: 2, output_tokens: 4 } } });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 2,
        outputTokens: 4,
        // base 2/1M + 8/1M = 0.00001; fee 6 × 100/1M = 0.0006
        totalRequestCost: '0.0006100000',
      });
    });

    it('merchant mode: a raw secret key as apiKey; the merchant wallet pays the base cost, no fee', async () => {
      const before = await balances();
      const { data, response } = await openaiClient(t.merchant.secretKey)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'merchant pays this' }], max_tokens: 10 })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expectNoTollgateCredential(seen);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));

      const record = await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'merchant',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 3,
        outputTokens: 10,
        customerId: null,
        meterId: null,
        // base 3/1M + 20/1M = 0.000023; no fee
        totalRequestCost: '0.0000230000',
      });
      expect(record.total_merchant_cost).toBe('0.0000230000');
      expect(record.total_wallet_cost).toBe('0.0000000000');
    });

    it('unmanaged: provider_key in the token reaches the provider as its Bearer key; base cost not charged', async () => {
      const token = lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug, provider_key: 'sk-caller-own' });
      const before = await balances();
      const { data, response } = await openaiClient(token)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'bring your own key' }], max_tokens: 1 })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers.authorization).toBe('Bearer sk-caller-own');
      expect(JSON.stringify(seen.headers)).not.toContain('sk-managed-openai');
      expectNoTollgateCredential(seen, token);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer_unmanaged',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 1,
        customerId: customer.customer_id,
        // fee 5 × 100/1M = 0.0005; base (4/1M + 2/1M) shown, not charged
        totalRequestCost: '0.0005000000',
      });
    });

    it('402 insufficient_balance reaches the client as an APIError before any provider call', async () => {
      const poor = (await lava.customers.create({ name: 'Empty wallet' })) as unknown as { customer_id: string; wallet: { wallet_id: string } };
      const token = lava.generateForwardToken({ customer_id: poor.customer_id, meter_slug: meter.meter_slug });
      const calls = upstream.requests.length;
      const error = await openaiClient(token)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'no money' }], max_tokens: 5 })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(error).toBeInstanceOf(OpenAI.APIError);
      const apiError = error as InstanceType<typeof OpenAI.APIError>;
      expect(apiError.status).toBe(402);
      expect(apiError.code).toBe('insufficient_balance');
      expect(apiError.headers?.get('x-tollgate-request-id')).toMatch(/^req_/);
      expect(upstream.requests.length).toBe(calls);
      expect((await findWallet(t.storage, poor.wallet.wallet_id))!).toMatchObject({ balance: 0n, held: 0n });
    });
  });
});
