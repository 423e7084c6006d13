import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { BROKE_MESSAGE, countingFetch, useClientHarness, WEATHER_CALL } from '../helpers/client-harness.ts';
import { covers, type Call, type ClientPath } from '../helpers/client-matrix.ts';

/**
 * @anthropic-ai/sdk 1.x through Tollgate's drop-in `/v1/messages` with a spend key (base URL the
 * gateway's root: the client adds `/v1/…`) and through the published client's
 * `providers.anthropic` forward base with a forward token. Every call sends "one two three four"
 * (4 input tokens at the mock) capped at 3 output tokens: claude-haiku-4-5 at 1 in / 5 out per 1M
 * costs 4 + 15 = 19 per 1M = 0.000019, plus through forward the fee of 7 × 100 per 1M = 0.0007.
 */
const h = useClientHarness();

type Via = Exclude<ClientPath, 'rewrite'>;
const TOTAL: Record<Via, string> = { 'drop-in': '0.0000190000', forward: '0.0007190000' };
const MESSAGE = { model: 'claude-haiku-4-5', max_tokens: 3, messages: [{ role: 'user' as const, content: 'one two three four' }] };
const WEATHER_TOOL = { name: 'get_weather', description: 'The weather in a city', input_schema: { type: 'object' as const, properties: { city: { type: 'string' } } } };

async function client(path: Via, opts: { key?: string; fetch?: typeof fetch; maxRetries?: number } = {}): Promise<Anthropic> {
  const key = opts.key ?? (path === 'drop-in' ? await h.spendKey('anthropic') : h.token());
  const baseURL = path === 'drop-in' ? h.base : h.lava.providers.anthropic;
  return new Anthropic({ apiKey: key, baseURL, maxRetries: opts.maxRetries ?? 0, ...(opts.fetch ? { fetch: opts.fetch } : {}) });
}

const refusal = async (call: Promise<unknown>) => call.then(() => null, (e: unknown) => e);

describe.each(['drop-in', 'forward'] as const)('@anthropic-ai/sdk through %s', (path) => {
  const on = (...calls: Call[]) => covers(...calls.map((call) => ({ client: '@anthropic-ai/sdk' as const, call, path })));

  it('messages.create: the text, stop reason and usage; one record at the exact cost', on('text'), async () => {
    const { data, response } = await (await client(path)).messages.create(MESSAGE).withResponse();
    expect(h.lastUpstream().path).toBe('/v1/messages');
    expect(h.lastUpstream().headers['x-api-key']).toBe('sk-ant-managed');
    expect(data).toMatchObject({ type: 'message', content: [{ type: 'text', text: 'tok tok tok' }], stop_reason: 'max_tokens', usage: { input_tokens: 4, output_tokens: 3 } });
    const record = await h.expectBilled(response.headers.get('x-tollgate-request-id'), { path, model: 'anthropic/claude-haiku-4-5', input: 4, output: 3, total: TOTAL[path] });
    expect(record.response_id).toBe(data.id);
  });

  it('messages.stream: every text delta and the final usage; one record at the exact cost', on('text stream'), async () => {
    const stream = (await client(path)).messages.stream(MESSAGE);
    const texts: string[] = [];
    stream.on('text', (text) => texts.push(text));
    const message = await stream.finalMessage();
    const { response } = await stream.withResponse();
    expect(texts).toEqual(['tok', ' tok', ' tok']);
    expect(message.usage).toMatchObject({ input_tokens: 4, output_tokens: 3 });
    await h.expectBilled(response.headers.get('x-tollgate-request-id'), { path, model: 'anthropic/claude-haiku-4-5', input: 4, output: 3, total: TOTAL[path] });
  });

  it('a tool_use block arrives with its input, JSON and streamed', on('tool call', 'tool call stream'), async () => {
    h.upstream.setNext({ toolCall: WEATHER_CALL, times: 2 });
    const anthropic = await client(path);
    const message = await anthropic.messages.create({ ...MESSAGE, tools: [WEATHER_TOOL] });
    expect(h.lastUpstream().json).toMatchObject({ tools: [WEATHER_TOOL] });
    expect(message.stop_reason).toBe('tool_use');
    expect(message.content).toEqual([{ type: 'tool_use', id: expect.stringMatching(/^toolu_mock/), name: 'get_weather', input: WEATHER_CALL.arguments }]);
    await h.expectBilled(null, { path, model: 'anthropic/claude-haiku-4-5', input: 4, output: 3, total: TOTAL[path] });

    const streamed = await anthropic.messages.stream({ ...MESSAGE, tools: [WEATHER_TOOL] }).finalMessage();
    expect(streamed.content).toMatchObject([{ type: 'tool_use', name: 'get_weather', input: WEATHER_CALL.arguments }]);
    expect(await h.recordsOnceThere(2)).toHaveLength(2);
  });

  it('a stream the provider cuts fails in the client and is billed as estimated', on('cut stream billed from what arrived'), async () => {
    // message_start (4 input and 1 output reported), block start, ping, "tok", " tok" — then the cut.
    h.upstream.setNext({ cutAfterChunks: 5 });
    const stream = (await client(path)).messages.stream(MESSAGE);
    const texts: string[] = [];
    stream.on('text', (text) => texts.push(text));
    expect(await refusal(stream.finalMessage())).toBeInstanceOf(Anthropic.AnthropicError);
    expect(texts).toEqual(['tok', ' tok']);
    // 1 reported + "tok tok" (7 characters) estimated as 2: 4 × 1 + 3 × 5 = 19 per 1M.
    await h.expectBilled(null, { path, model: 'anthropic/claude-haiku-4-5', input: 4, output: 3, total: TOTAL[path], estimated: true });
  });

  it("an empty wallet's 402 is the SDK's PaymentRequiredError with Tollgate's message and Anthropic's error type", on("refusal in the client's dialect"), async () => {
    const broke = await client(path, { key: await h.brokeCredential(path, 'anthropic') });
    const error = await refusal(broke.messages.create(MESSAGE));
    expect(error).toBeInstanceOf(Anthropic.PaymentRequiredError);
    expect(error).toMatchObject({ status: 402, type: 'billing_error', apiMessage: BROKE_MESSAGE, errorCode: 'insufficient_balance' });
    // The interface's code and status ride along in Anthropic's error object.
    expect((error as InstanceType<typeof Anthropic.APIError>).error).toMatchObject({ type: 'error', error: { code: 'insufficient_balance', status: 402 } });
    await h.expectNothingCharged();
  });
});

describe('@anthropic-ai/sdk listing models and counting tokens', () => {
  it('models.list through forward: the provider\'s list in Anthropic\'s shape', covers({ client: '@anthropic-ai/sdk', call: 'models', path: 'forward' }), async () => {
    const ids: string[] = [];
    for await (const model of (await client('forward')).models.list()) ids.push(model.id);
    expect(h.lastUpstream()).toMatchObject({ method: 'GET', path: '/v1/models' });
    expect(ids).toEqual(['claude-haiku-4-5', 'claude-sonnet-4-5']);
  });

  it('messages.countTokens through forward: the provider\'s count, nothing charged', covers({ client: '@anthropic-ai/sdk', call: 'count tokens', path: 'forward' }), async () => {
    const counted = await (await client('forward')).messages.countTokens({ model: MESSAGE.model, messages: MESSAGE.messages });
    expect(h.lastUpstream().path).toBe('/v1/messages/count_tokens');
    expect(counted).toEqual({ input_tokens: 4 });
    const [record] = await h.recordsOnceThere(1);
    expect(await h.t.settledRecord(record!.request_id)).toMatchObject({ status: 'completed', total_request_cost: '0.0000000000' });
  });

  it("models.list on the drop-in: Anthropic's list of the models the key may use", covers({ client: '@anthropic-ai/sdk', call: 'models', path: 'drop-in' }), async () => {
    const ids: string[] = [];
    for await (const model of (await client('drop-in')).models.list()) {
      expect(model.type).toBe('model');
      ids.push(model.id);
    }
    expect(ids).toContain('claude-haiku-4-5');
    expect(ids.every((id) => id.startsWith('claude-'))).toBe(true);
  });

  it("messages.countTokens on the drop-in: the provider's count, nothing charged", covers({ client: '@anthropic-ai/sdk', call: 'count tokens', path: 'drop-in' }), async () => {
    const counted = await (await client('drop-in')).messages.countTokens({ model: MESSAGE.model, messages: MESSAGE.messages });
    expect(h.lastUpstream().path).toBe('/v1/messages/count_tokens');
    expect(counted).toEqual({ input_tokens: 4 });
    const [record] = await h.recordsOnceThere(1);
    expect(await h.t.settledRecord(record!.request_id)).toMatchObject({ total_request_cost: '0.0000000000' });
  });
});

describe('@anthropic-ai/sdk and a request limit that never resets', () => {
  it('refuses the call over the limit once: the SDK does not retry it', covers({ client: '@anthropic-ai/sdk', call: 'non-retryable refusal not retried', path: 'drop-in' }), async () => {
    const counted = countingFetch();
    const key = await h.limitedSpendKey({ request_shape: 'anthropic', request_limit: { count: 1, cycle: 'total' } });
    // The SDK's default of two retries: the refusal (403, x-should-retry: false) gets none of them.
    const anthropic = await client('drop-in', { key, fetch: counted.fetch, maxRetries: 2 });
    await anthropic.messages.create(MESSAGE);
    const error = await refusal(anthropic.messages.create(MESSAGE));
    expect(error).toBeInstanceOf(Anthropic.PermissionDeniedError);
    expect(error).toMatchObject({ status: 403, type: 'permission_error' });
    expect(counted.calls()).toBe(2);
    expect(h.upstream.requests).toHaveLength(1);
  });
});
