import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  estimateInputTokensFromRequest,
  findProvider,
  isInjectedUsageChunk,
  type ProviderModule,
  type SseEvent,
  type StreamUsage,
} from '../../src/providers/index.ts';

// ---- Recorded-looking streams ------------------------------------------------------------------

const sse = (events: string[], eol = '\n'): string => events.map((e) => `${e.split('\n').join(eol)}${eol}${eol}`).join('');

const OPENAI_CHAT_REQUEST = {
  model: 'gpt-4o-mini',
  stream: true,
  stream_options: { include_usage: true },
  messages: [{ role: 'user', content: 'Say hello to the world in German, please.' }],
};
const chunk = (fields: string) =>
  `data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_06737a9306",${fields}}`;
const OPENAI_CHAT_STREAM = sse([
  chunk('"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null'),
  chunk('"choices":[{"index":0,"delta":{"content":"Hallo"},"logprobs":null,"finish_reason":null}],"usage":null'),
  chunk('"choices":[{"index":0,"delta":{"content":", schöne Welt 🌍!"},"logprobs":null,"finish_reason":null}],"usage":null'),
  chunk('"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null'),
  chunk(
    '"choices":[],"usage":{"prompt_tokens":19,"completion_tokens":9,"total_tokens":28,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}',
  ),
  'data: [DONE]',
]);

const OPENAI_RESPONSES_STREAM = sse([
  'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190","object":"response","status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null}}',
  'event: response.output_item.added\ndata: {"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_67c9fdcf","type":"message","status":"in_progress","role":"assistant","content":[]}}',
  'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_67c9fdcf","output_index":0,"content_index":0,"delta":"Hi"}',
  'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_67c9fdcf","output_index":0,"content_index":0,"delta":" there, ça va?"}',
  'event: response.output_text.done\ndata: {"type":"response.output_text.done","sequence_number":4,"item_id":"msg_67c9fdcf","output_index":0,"content_index":0,"text":"Hi there, ça va?"}',
  'event: response.completed\ndata: {"type":"response.completed","sequence_number":5,"response":{"id":"resp_67c9fdcecf488190","object":"response","status":"completed","model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c9fdcf","type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi there, ça va?"}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":5},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}}}',
]);

const ANTHROPIC_REQUEST = {
  model: 'claude-sonnet-4-5',
  max_tokens: 1024,
  stream: true,
  messages: [{ role: 'user', content: 'Hello, Claude' }],
};
const ANTHROPIC_STREAM = sse([
  'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}',
  'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
  'event: ping\ndata: {"type": "ping"}',
  'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}',
  'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"! Grüß dich — how can I help?"}}',
  'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}',
  'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}',
  'event: message_stop\ndata: {"type":"message_stop"}',
]);

const GEMINI_URL = 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse';
const GEMINI_REQUEST = { contents: [{ role: 'user', parts: [{ text: 'Write a haiku about the sea.' }] }] };
// Gemini separates events with CRLF.
const GEMINI_STREAM = sse(
  [
    'data: {"candidates": [{"content": {"parts": [{"text": "Waves fold into foam,"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "gemini-2.5-flash","responseId": "mAitaJ3IBo2wnvgP"}',
    'data: {"candidates": [{"content": {"parts": [{"text": "\\nsalt wind carries gull cries—"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "gemini-2.5-flash","responseId": "mAitaJ3IBo2wnvgP"}',
    'data: {"candidates": [{"content": {"parts": [{"text": "\\nthe tide keeps its time."}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 21,"thoughtsTokenCount": 310,"cachedContentTokenCount": 4,"totalTokenCount": 340},"modelVersion": "gemini-2.5-flash","responseId": "mAitaJ3IBo2wnvgP"}',
  ],
  '\r\n',
);

type Fixture = {
  name: string;
  url: string;
  request: unknown;
  stream: string;
  expected: Partial<StreamUsage>;
  /** Index into the stream just before the end-of-stream marker. */
  terminalAt: number;
};

const FIXTURES: Fixture[] = [
  {
    name: 'OpenAI chat completions',
    url: 'https://api.openai.com/v1/chat/completions',
    request: OPENAI_CHAT_REQUEST,
    stream: OPENAI_CHAT_STREAM,
    expected: { inputTokens: 19, outputTokens: 9, cachedInputTokens: 0, model: 'gpt-4o-mini-2024-07-18', responseId: 'chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT' },
    terminalAt: OPENAI_CHAT_STREAM.indexOf('data: [DONE]'),
  },
  {
    name: 'OpenAI Responses API',
    url: 'https://api.openai.com/v1/responses',
    request: { model: 'gpt-4.1', stream: true, input: 'Say hi' },
    stream: OPENAI_RESPONSES_STREAM,
    expected: { inputTokens: 37, outputTokens: 11, cachedInputTokens: 5, model: 'gpt-4.1-2025-04-14', responseId: 'resp_67c9fdcecf488190' },
    terminalAt: OPENAI_RESPONSES_STREAM.indexOf('event: response.completed'),
  },
  {
    name: 'Anthropic messages',
    url: 'https://api.anthropic.com/v1/messages',
    request: ANTHROPIC_REQUEST,
    stream: ANTHROPIC_STREAM,
    expected: {
      inputTokens: 2125,
      outputTokens: 15,
      cachedInputTokens: 2000,
      cacheWriteInputTokens: 100,
      model: 'claude-sonnet-4-5-20250929',
      responseId: 'msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY',
    },
    terminalAt: ANTHROPIC_STREAM.indexOf('event: message_stop'),
  },
  {
    name: 'Gemini streamGenerateContent (alt=sse)',
    url: GEMINI_URL,
    request: GEMINI_REQUEST,
    stream: GEMINI_STREAM,
    expected: { inputTokens: 9, outputTokens: 331, cachedInputTokens: 4, model: 'gemini-2.5-flash', responseId: 'mAitaJ3IBo2wnvgP' },
    terminalAt: GEMINI_STREAM.lastIndexOf('data: '),
  },
];

// ---- Helpers ----------------------------------------------------------------------------------

function provider(url: string): ProviderModule {
  const found = findProvider(new URL(url));
  if (!found) throw new Error(`no provider for ${url}`);
  return found;
}

function meter(fixture: Fixture, chunks: (string | Uint8Array)[]): StreamUsage {
  const m = provider(fixture.url).createStreamMeter({ now: Date.now(), url: new URL(fixture.url), requestBody: fixture.request });
  for (const piece of chunks) m.push(piece);
  return m.finish();
}

/** Cuts `bytes` at the given sorted offsets. */
function splitAt(bytes: Uint8Array, offsets: number[]): Uint8Array[] {
  const pieces: Uint8Array[] = [];
  let start = 0;
  for (const offset of [...offsets, bytes.length]) {
    pieces.push(bytes.subarray(start, offset));
    start = offset;
  }
  return pieces;
}

const encode = (text: string) => new TextEncoder().encode(text);

// ---- Tests ------------------------------------------------------------------------------------

describe.each(FIXTURES)('stream meter: $name', (fixture) => {
  const bytes = encode(fixture.stream);

  it('reads the provider usage from a whole stream', () => {
    expect(meter(fixture, [fixture.stream])).toMatchObject({ ...fixture.expected, complete: true, estimated: false });
  });

  it('gives the same result for a split at every byte boundary', () => {
    const whole = meter(fixture, [bytes]);
    for (let offset = 0; offset <= bytes.length; offset++) {
      expect(meter(fixture, splitAt(bytes, [offset]))).toEqual(whole);
    }
  });

  it('gives the same result for any split into many chunks, bytes or text', () => {
    const whole = meter(fixture, [bytes]);
    const offsets = fc.uniqueArray(fc.integer({ min: 0, max: bytes.length }), { maxLength: 40 }).map((o) => o.sort((a, b) => a - b));
    fc.assert(
      fc.property(offsets, (cuts) => {
        expect(meter(fixture, splitAt(bytes, cuts))).toEqual(whole);
      }),
      { numRuns: 200 },
    );
    fc.assert(
      fc.property(offsets.map((cuts) => cuts.filter((cut) => cut <= fixture.stream.length)), (cuts) => {
        const text: string[] = [];
        let start = 0;
        for (const cut of [...cuts, fixture.stream.length]) {
          text.push(fixture.stream.slice(start, cut));
          start = cut;
        }
        expect(meter(fixture, text)).toEqual(whole);
      }),
      { numRuns: 200 },
    );
  });

  it('flags a stream cut before its end marker as incomplete, at every cut point', () => {
    for (let offset = 0; offset < encode(fixture.stream.slice(0, fixture.terminalAt)).length; offset++) {
      expect(meter(fixture, [bytes.subarray(0, offset)]).complete).toBe(false);
    }
  });
});

describe('cut streams are settled from what was seen, never free', () => {
  const cutAfter = (fixture: Fixture, marker: string): string => {
    const at = fixture.stream.indexOf(marker);
    if (at < 0) throw new Error(`marker ${marker} not in ${fixture.name}`);
    return fixture.stream.slice(0, at + marker.length);
  };
  const fixture = (name: string) => FIXTURES.find((f) => f.name.startsWith(name)) as Fixture;

  it('OpenAI chat: estimates output from the deltas and input from the request', () => {
    const openai = fixture('OpenAI chat');
    const usage = meter(openai, [cutAfter(openai, 'schöne Welt 🌍!"},"logprobs":null,"finish_reason":null}],"usage":null}\n\n')]);
    const deltaCharacters = 'Hallo, schöne Welt 🌍!'.length;
    expect(usage).toMatchObject({ complete: false, estimated: true, model: 'gpt-4o-mini-2024-07-18' });
    expect(usage.outputTokens).toBe(Math.ceil(deltaCharacters / 4));
    expect(usage.inputTokens).toBe(estimateInputTokensFromRequest(OPENAI_CHAT_REQUEST));
    expect(usage.inputTokens).toBeGreaterThan(0);
  });

  it('OpenAI chat: keeps exact counts when only [DONE] is missing', () => {
    const openai = fixture('OpenAI chat');
    const usage = meter(openai, [openai.stream.slice(0, openai.terminalAt)]);
    expect(usage).toMatchObject({ complete: false, estimated: false, inputTokens: 19, outputTokens: 9 });
  });

  it('Anthropic: exact input from message_start plus estimated output after it', () => {
    const anthropic = fixture('Anthropic');
    const usage = meter(anthropic, [cutAfter(anthropic, 'how can I help?"}}\n\n')]);
    expect(usage).toMatchObject({ complete: false, estimated: true, inputTokens: 2125, cachedInputTokens: 2000 });
    expect(usage.outputTokens).toBe(1 + Math.ceil('Hello! Grüß dich — how can I help?'.length / 4));
  });

  it('Gemini: exact prompt count from the chunks, estimated output', () => {
    const gemini = fixture('Gemini');
    const usage = meter(gemini, [cutAfter(gemini, 'carries gull cries—')]);
    expect(usage).toMatchObject({ complete: false, estimated: true, inputTokens: 9, model: 'gemini-2.5-flash' });
    // The second event was cut mid-line, so only the first event's text counts.
    expect(usage.outputTokens).toBe(Math.ceil('Waves fold into foam,'.length / 4));
  });

  it('Responses API: estimates from the deltas seen', () => {
    const responses = fixture('OpenAI Responses');
    const usage = meter(responses, [responses.stream.slice(0, responses.terminalAt)]);
    expect(usage).toMatchObject({ complete: false, estimated: true });
    expect(usage.outputTokens).toBe(Math.ceil('Hi there, ça va?'.length / 4));
  });

  it('estimates input from prompt text only, and survives absurdly nested bodies', () => {
    const request = { model: 'gpt-4o', messages: [{ role: 'user', content: [{ type: 'text', text: '12345678' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] };
    expect(estimateInputTokensFromRequest(request)).toBe(2);
    let nested: unknown = 'deep';
    for (let i = 0; i < 100_000; i++) nested = [nested];
    expect(estimateInputTokensFromRequest(nested)).toBe(0);
  });

  it('a stream with no event at all is still incomplete and estimated from the request', () => {
    const usage = meter(fixture('Anthropic'), []);
    expect(usage).toMatchObject({ complete: false, estimated: true, outputTokens: 0, model: 'claude-sonnet-4-5' });
    expect(usage.inputTokens).toBeGreaterThan(0);
  });

  it('a complete stream without usage (provider ignored include_usage) is estimated, not free', () => {
    const noUsage = OPENAI_CHAT_STREAM.split('\n\n').filter((event) => !event.includes('"choices":[]')).join('\n\n');
    const usage = meter({ ...fixture('OpenAI chat'), stream: noUsage }, [noUsage]);
    expect(usage).toMatchObject({ complete: true, estimated: true });
    expect(usage.outputTokens).toBeGreaterThan(0);
  });
});

describe('stream quirks', () => {
  it('reads Groq usage from x_groq.usage', () => {
    const url = 'https://api.groq.com/openai/v1/chat/completions';
    const stream = sse([
      'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"llama-3.3-70b-versatile","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"x_groq":{"id":"req_01"}}',
      'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"llama-3.3-70b-versatile","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"x_groq":{"id":"req_01","usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42}}}',
      'data: [DONE]',
    ]);
    const m = provider(url).createStreamMeter({ now: Date.now(), url: new URL(url), requestBody: { model: 'llama-3.3-70b-versatile' } });
    m.push(stream);
    expect(m.finish()).toMatchObject({ inputTokens: 40, outputTokens: 2, complete: true, estimated: false });
  });

  it('counts tool-call arguments and reasoning as output text for estimates', () => {
    const url = 'https://api.deepseek.com/chat/completions';
    const stream = sse([
      'data: {"id":"1","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"reasoning_content":"12345678"}}]}',
      'data: {"id":"1","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":1}"}}]}}]}',
    ]);
    const m = provider(url).createStreamMeter({ now: Date.now(), url: new URL(url), requestBody: {} });
    m.push(stream);
    expect(m.finish()).toMatchObject({ complete: false, estimated: true, outputTokens: Math.ceil((8 + 7) / 4) });
  });

  it('counts a multi-byte character split across two byte chunks once', () => {
    const url = 'https://api.mistral.ai/v1/chat/completions';
    const stream = encode(sse([`data: {"id":"1","choices":[{"index":0,"delta":{"content":"${'ö'.repeat(8)}"}}]}`, 'data: [DONE]']));
    for (let offset = 0; offset <= stream.length; offset++) {
      const m = provider(url).createStreamMeter({ now: Date.now(), url: new URL(url), requestBody: {} });
      for (const piece of splitAt(stream, [offset])) m.push(piece);
      // 8 characters, 16 bytes: a broken decode would see 9 or more characters and say 3 tokens.
      expect(m.finish().outputTokens).toBe(2);
    }
  });

  it('still reads a last event that lacks its closing blank line', () => {
    const fixture = FIXTURES[0] as Fixture;
    const unterminated = fixture.stream.replace(/\n\n$/, '');
    expect(meter(fixture, [unterminated])).toMatchObject({ ...fixture.expected, complete: true });
  });

  it('ignores comments, unknown events and malformed data', () => {
    const fixture = FIXTURES[0] as Fixture;
    const noisy = `: keep-alive\n\nevent: weird\ndata: {not json\n\n${fixture.stream}`;
    expect(meter(fixture, [noisy])).toMatchObject({ ...fixture.expected, complete: true });
  });

  it('ElevenLabs audio streams are metered from the request, never incomplete', () => {
    const url = 'https://api.elevenlabs.io/v1/text-to-speech/voice123/stream';
    const m = provider(url).createStreamMeter({ now: Date.now(), url: new URL(url), requestBody: { text: 'Hello there', model_id: 'eleven_flash_v2_5' } });
    m.push(new Uint8Array([0xff, 0xfb, 0x90, 0x00]));
    expect(m.finish()).toMatchObject({ inputCharacters: 11, complete: true, estimated: false, model: 'eleven_flash_v2_5' });
  });
});

describe('asking for stream usage, and hiding the injected chunk', () => {
  const openai = provider('https://api.openai.com/v1');
  const chatUrl = new URL('https://api.openai.com/v1/chat/completions');

  it('adds include_usage to a streaming chat request that lacks it, without mutating the original', () => {
    const body = { model: 'gpt-4o-mini', stream: true, stream_options: { some_future_flag: 1 }, messages: [] };
    const prepared = openai.prepareStreamRequest(body, chatUrl);
    expect(prepared.injectedUsage).toBe(true);
    expect(prepared.body).toEqual({ ...body, stream_options: { some_future_flag: 1, include_usage: true } });
    expect(body.stream_options).toEqual({ some_future_flag: 1 });
  });

  it('also overrides an explicit include_usage: false, since the gateway must bill', () => {
    const prepared = openai.prepareStreamRequest({ stream: true, stream_options: { include_usage: false } }, chatUrl);
    expect(prepared).toEqual({ body: { stream: true, stream_options: { include_usage: true } }, injectedUsage: true });
  });

  it('leaves requests alone that already ask, do not stream, or are not completions', () => {
    const asks = { stream: true, stream_options: { include_usage: true } };
    expect(openai.prepareStreamRequest(asks, chatUrl)).toEqual({ body: asks, injectedUsage: false });
    expect(openai.prepareStreamRequest(asks, chatUrl).body).toBe(asks);
    const notStreaming = { stream: false };
    expect(openai.prepareStreamRequest(notStreaming, chatUrl).body).toBe(notStreaming);
    const responses = { stream: true, input: 'hi' };
    expect(openai.prepareStreamRequest(responses, new URL('https://api.openai.com/v1/responses')).injectedUsage).toBe(false);
    expect(openai.prepareStreamRequest('raw text', chatUrl).injectedUsage).toBe(false);
    const claude = provider('https://api.anthropic.com/v1');
    expect(claude.prepareStreamRequest({ stream: true }, new URL('https://api.anthropic.com/v1/messages')).injectedUsage).toBe(false);
  });

  it('also asks on legacy completions and on every OpenAI-compatible host', () => {
    expect(openai.prepareStreamRequest({ stream: true }, new URL('https://api.openai.com/v1/completions')).injectedUsage).toBe(true);
    const groq = provider('https://api.groq.com/openai/v1');
    expect(groq.prepareStreamRequest({ stream: true }, new URL('https://api.groq.com/openai/v1/chat/completions')).injectedUsage).toBe(true);
  });

  it('recognises exactly the usage-only chunk', () => {
    const events: SseEvent[] = [];
    const reader = OPENAI_CHAT_STREAM.split('\n\n').filter(Boolean).map((block) => ({ data: block.replace(/^data: /, '') }));
    events.push(...reader);
    const hidden = events.filter((event) => openai.isInjectedUsageEvent(event));
    expect(hidden).toHaveLength(1);
    expect(hidden[0]?.data).toContain('"choices":[]');
    expect(isInjectedUsageChunk({ data: '[DONE]' })).toBe(false);
    // Usage riding on a chunk with content is not the injected one: the client must get it.
    expect(isInjectedUsageChunk({ data: '{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":1}}' })).toBe(false);
    expect(isInjectedUsageChunk({ data: '{"choices":[],"usage":null}' })).toBe(false);
    // Spaced JSON is still recognised; a nested empty `choices` with a top-level one full is not it.
    expect(isInjectedUsageChunk({ data: '{"choices": [ ], "usage": {"prompt_tokens": 1}}' })).toBe(true);
    expect(isInjectedUsageChunk({ data: '{"choices":[{"x":{"choices":[]}}],"usage":{"prompt_tokens":1}}' })).toBe(false);
    expect(provider('https://api.anthropic.com/v1').isInjectedUsageEvent({ data: '{"choices":[],"usage":{}}' })).toBe(false);
  });
});
