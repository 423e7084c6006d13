import { describe, expect, it } from 'vitest';
import { findProvider, type MeterContext, type ProviderModule } from '../../src/providers/index.ts';
import { modelFromPath } from '../../src/providers/google.ts';
import { timestampFromUnixSeconds } from '../../src/providers/usage.ts';

function providerFor(target: string): { provider: ProviderModule; url: URL } {
  const url = new URL(target);
  const provider = findProvider(url);
  if (!provider) throw new Error(`no provider for ${target}`);
  return { provider, url };
}

function usage(target: string, requestBody: unknown, responseBody: unknown) {
  const { provider, url } = providerFor(target);
  const ctx: MeterContext = { url, requestBody, now: Date.now() };
  return provider.usageFromJson(responseBody, ctx);
}

describe('OpenAI-compatible usage from JSON', () => {
  it('reads chat completions usage with cached prompt tokens', () => {
    const response = {
      id: 'chatcmpl-AbC123',
      object: 'chat.completion',
      model: 'gpt-4o-2024-08-06',
      choices: [{ index: 0, message: { role: 'assistant', content: 'Hi!' }, finish_reason: 'stop' }],
      usage: {
        prompt_tokens: 1200,
        completion_tokens: 42,
        total_tokens: 1242,
        prompt_tokens_details: { cached_tokens: 1024, audio_tokens: 0 },
        completion_tokens_details: { reasoning_tokens: 0 },
      },
    };
    expect(usage('https://api.openai.com/v1/chat/completions', { model: 'gpt-4o' }, response)).toEqual({
      inputTokens: 1200,
      outputTokens: 42,
      cachedInputTokens: 1024,
      reasoningTokens: 0,
      audioInputTokens: 0,
      inputCharacters: 0,
      outputCharacters: 0,
      inputSeconds: 0,
      outputSeconds: 0,
      model: 'gpt-4o-2024-08-06',
      responseId: 'chatcmpl-AbC123',
    });
  });

  it('reads Responses API usage', () => {
    const response = {
      id: 'resp_67ccd2bed1ec8190',
      object: 'response',
      model: 'gpt-4.1-2025-04-14',
      usage: {
        input_tokens: 36,
        input_tokens_details: { cached_tokens: 6 },
        output_tokens: 87,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: 123,
      },
    };
    expect(usage('https://api.openai.com/v1/responses', { model: 'gpt-4.1' }, response)).toMatchObject({
      inputTokens: 36,
      outputTokens: 87,
      cachedInputTokens: 6,
      model: 'gpt-4.1-2025-04-14',
      responseId: 'resp_67ccd2bed1ec8190',
    });
  });

  it('reads embeddings usage as prompt tokens and zero output', () => {
    const response = {
      object: 'list',
      data: [{ object: 'embedding', index: 0, embedding: [0.1, 0.2] }],
      model: 'text-embedding-3-small',
      usage: { prompt_tokens: 8, total_tokens: 8 },
    };
    expect(usage('https://api.openai.com/v1/embeddings', { model: 'text-embedding-3-small' }, response)).toMatchObject({
      inputTokens: 8,
      outputTokens: 0,
      model: 'text-embedding-3-small',
    });
  });

  it('reads whisper duration usage as input seconds', () => {
    const response = { text: 'hello', usage: { type: 'duration', seconds: 3.2 } };
    expect(usage('https://api.openai.com/v1/audio/transcriptions', { model: 'whisper-1' }, response)).toMatchObject({
      inputSeconds: 3.2,
      inputTokens: 0,
      outputTokens: 0,
    });
  });

  it('takes the request model when the response names none, for any compatible host', () => {
    const response = { id: 'x1', usage: { prompt_tokens: 5, completion_tokens: 7 } };
    expect(
      usage('https://api.groq.com/openai/v1/chat/completions', { model: 'llama-3.3-70b-versatile' }, response),
    ).toMatchObject({ inputTokens: 5, outputTokens: 7, model: 'llama-3.3-70b-versatile', responseId: 'x1' });
  });

  it('returns null when there is no usage (model lists, errors, wrong types)', () => {
    const target = 'https://api.openai.com/v1/models';
    expect(usage(target, undefined, { object: 'list', data: [] })).toBeNull();
    expect(usage(target, undefined, { error: { message: 'nope' } })).toBeNull();
    expect(usage(target, undefined, { usage: { prompt_tokens: '12' } })).toBeNull();
    expect(usage(target, undefined, 'plain text')).toBeNull();
    expect(usage(target, undefined, null)).toBeNull();
  });

  it('bills OpenAI text-to-speech (an audio response) by input characters from the request', () => {
    const { provider, url } = providerFor('https://api.openai.com/v1/audio/speech');
    expect(provider.usageFromRequest({ now: Date.now(), url, requestBody: { model: 'tts-1', input: 'héllo 👋', voice: 'alloy' } })).toMatchObject({
      inputCharacters: 7,
      model: 'tts-1',
    });
    const chat = providerFor('https://api.openai.com/v1/chat/completions');
    expect(chat.provider.usageFromRequest({ now: Date.now(), url: chat.url, requestBody: { input: 'x' } })).toBeNull();
  });
});

describe('Anthropic usage from JSON', () => {
  const message = {
    id: 'msg_013Zva2CMHLNnXjNJJKqJ2EF',
    type: 'message',
    role: 'assistant',
    model: 'claude-sonnet-4-5-20250929',
    content: [{ type: 'text', text: 'Hi!' }],
    stop_reason: 'end_turn',
    usage: { input_tokens: 25, cache_creation_input_tokens: 100, cache_read_input_tokens: 2000, output_tokens: 15 },
  };

  it('folds cache reads and writes into the input total', () => {
    expect(usage('https://api.anthropic.com/v1/messages', { model: 'claude-sonnet-4-5' }, message)).toEqual({
      inputTokens: 2125,
      outputTokens: 15,
      cachedInputTokens: 2000,
      cacheWriteInputTokens: 100,
      inputCharacters: 0,
      outputCharacters: 0,
      inputSeconds: 0,
      outputSeconds: 0,
      model: 'claude-sonnet-4-5-20250929',
      responseId: 'msg_013Zva2CMHLNnXjNJJKqJ2EF',
    });
  });

  it('does not bill count_tokens', () => {
    expect(usage('https://api.anthropic.com/v1/messages/count_tokens', {}, { input_tokens: 2095 })).toBeNull();
  });
});

describe('Google Gemini usage from JSON', () => {
  const target = 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent';
  const response = {
    candidates: [{ content: { parts: [{ text: 'Hello' }], role: 'model' }, finishReason: 'STOP', index: 0 }],
    usageMetadata: {
      promptTokenCount: 120,
      candidatesTokenCount: 30,
      thoughtsTokenCount: 200,
      cachedContentTokenCount: 64,
      totalTokenCount: 350,
    },
    modelVersion: 'gemini-2.5-flash-001',
    responseId: 'mAitaJ3IBo',
  };

  it('reads usageMetadata; thinking tokens are output', () => {
    expect(usage(target, {}, response)).toMatchObject({
      inputTokens: 120,
      outputTokens: 230,
      cachedInputTokens: 64,
      model: 'gemini-2.5-flash-001',
      responseId: 'mAitaJ3IBo',
    });
  });

  it('takes the model from the URL when the response has no modelVersion', () => {
    const { modelVersion: _dropped, ...withoutModel } = response;
    expect(usage(target, {}, withoutModel)?.model).toBe('gemini-2.5-flash');
  });

  it('reads the last usage of a JSON-array stream (streamGenerateContent without alt=sse)', () => {
    const first = { candidates: [{ content: { parts: [{ text: 'He' }] } }], usageMetadata: { promptTokenCount: 120 } };
    const streamTarget = target.replace(':generateContent', ':streamGenerateContent');
    expect(usage(streamTarget, {}, [first, response])).toMatchObject({ inputTokens: 120, outputTokens: 230 });
  });

  it('returns null for countTokens and embeddings', () => {
    expect(usage(target.replace('generateContent', 'countTokens'), {}, { totalTokens: 31 })).toBeNull();
    expect(usage(target.replace('generateContent', 'embedContent'), {}, { embedding: { values: [0.1] } })).toBeNull();
  });

  it('parses the model out of native paths', () => {
    expect(modelFromPath('/v1beta/models/gemini-2.0-flash:streamGenerateContent')).toBe('gemini-2.0-flash');
    expect(modelFromPath('/v1/models/gemini-1.5-pro-002:generateContent')).toBe('gemini-1.5-pro-002');
    expect(modelFromPath('/v1beta/tunedModels/my-model-x1:generateContent')).toBe('my-model-x1');
    expect(modelFromPath('/v1beta/models/gemini-2.5-pro')).toBe('gemini-2.5-pro');
    expect(modelFromPath('/v1beta/files')).toBeNull();
  });
});

describe('ElevenLabs usage', () => {
  it('bills text-to-speech by input characters (code points), whatever the response', () => {
    const target = 'https://api.elevenlabs.io/v1/text-to-speech/JBFqnCBsd6RMkjVDRZzb/stream';
    const { provider, url } = providerFor(target);
    const ctx = { url, requestBody: { text: 'Hello 🌍!', model_id: 'eleven_multilingual_v2' }, now: Date.now() };
    expect(provider.usageFromRequest(ctx)).toMatchObject({ inputCharacters: 8, model: 'eleven_multilingual_v2' });
    // /with-timestamps answers JSON; the unit is still the request's characters.
    expect(provider.usageFromJson({ audio_base64: 'AAAA', alignment: {} }, ctx)).toMatchObject({ inputCharacters: 8 });
  });

  it('bills text-to-dialogue by the characters of every input', () => {
    const { provider, url } = providerFor('https://api.elevenlabs.io/v1/text-to-dialogue');
    const requestBody = { inputs: [{ text: 'Hi.', voice_id: 'a' }, { text: 'Hello!', voice_id: 'b' }] };
    expect(provider.usageFromRequest({ now: Date.now(), url, requestBody })).toMatchObject({ inputCharacters: 9 });
  });

  it('bills speech-to-text by seconds: the last word end when no duration is given', () => {
    const transcript = {
      language_code: 'en',
      text: 'Hello world!',
      words: [
        { text: 'Hello', start: 0.12, end: 0.5, type: 'word' },
        { text: ' ', start: 0.5, end: 0.6, type: 'spacing' },
        { text: 'world!', start: 0.6, end: 1.94, type: 'word' },
      ],
      transcription_id: 'tr_123',
    };
    const result = usage('https://api.elevenlabs.io/v1/speech-to-text', { model_id: 'scribe_v1' }, transcript);
    expect(result).toMatchObject({ inputSeconds: 1.94, inputCharacters: 0, model: 'scribe_v1', responseId: 'tr_123' });
  });

  it('prefers an explicit duration, and covers multichannel transcripts', () => {
    const target = 'https://api.elevenlabs.io/v1/speech-to-text';
    expect(usage(target, {}, { text: '', words: [], audio_duration_secs: 12.5 })?.inputSeconds).toBe(12.5);
    const multichannel = {
      transcripts: [
        { channel_index: 0, words: [{ text: 'a', start: 0, end: 3 }] },
        { channel_index: 1, words: [{ text: 'b', start: 0, end: 4.25 }] },
      ],
    };
    expect(usage(target, {}, multichannel)?.inputSeconds).toBe(4.25);
  });

  it('returns null when the duration is unknown or the endpoint carries no usage', () => {
    expect(usage('https://api.elevenlabs.io/v1/speech-to-text', {}, { text: 'hi' })).toBeNull();
    expect(usage('https://api.elevenlabs.io/v1/speech-to-text/transcripts/tr_1', {}, { words: [{ end: 9 }] })).toBeNull();
    expect(usage('https://api.elevenlabs.io/v1/voices', undefined, { voices: [] })).toBeNull();
  });
});

describe('provider times', () => {
  const now = Date.UTC(2026, 0, 1);

  it('reads Unix seconds as ISO 8601, to the millisecond', () => {
    expect(timestampFromUnixSeconds(1_700_000_000, now)).toBe('2023-11-14T22:13:20.000Z');
    expect(timestampFromUnixSeconds(1_700_000_000.25, now)).toBe('2023-11-14T22:13:20.250Z');
  });

  it('ignores absent and implausible times (milliseconds sent as seconds, before 2015, far ahead of our clock)', () => {
    expect(timestampFromUnixSeconds(undefined, now)).toBeUndefined();
    expect(timestampFromUnixSeconds(0, now)).toBeUndefined();
    expect(timestampFromUnixSeconds(1_700_000_000_000, now)).toBeUndefined();
    expect(timestampFromUnixSeconds(now / 1000 + 2 * 86_400, now)).toBeUndefined();
    expect(timestampFromUnixSeconds(now / 1000 + 60, now)).toBe(new Date(now + 60_000).toISOString());
  });

  it("bounds a response's time by the gateway's clock the meter context carries, not the system's", () => {
    const { provider, url } = providerFor('https://api.openai.com/v1/chat/completions');
    const created = now / 1000 + 60;
    const body = { id: 'chatcmpl-1', model: 'gpt-4o', created, usage: { prompt_tokens: 1, completion_tokens: 1 } };
    // A year before `created`, the time is not believed; a minute before, it is.
    expect(provider.usageFromJson(body, { url, requestBody: {}, now: now - 366 * 86_400_000 })?.completedAt).toBeUndefined();
    expect(provider.usageFromJson(body, { url, requestBody: {}, now })?.completedAt).toBe(new Date(now + 60_000).toISOString());
  });
});
