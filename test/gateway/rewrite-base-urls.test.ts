import { describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import { useRewriteHarness } from '../helpers/rewrite-harness.ts';

/**
 * Every shape of provider base a client may be given, with every path a client SDK appends to it:
 * the rewrite proxy calls the provider's one real endpoint (the mock answers 404 to any other
 * path), or refuses a base that is not the provider's before calling anything.
 */

const ANTHROPIC_BODY = { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] };
const OPENAI_BODY = { model: 'claude-haiku-4-5', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] };
const GOOGLE_BODY = { contents: [{ role: 'user', parts: [{ text: 'hi' }] }], generationConfig: { maxOutputTokens: 1 } };

describe.each(databasesUnderTest())('rewrite provider bases on %s', (dialect) => {
  const h = useRewriteHarness(dialect);

  const post = (path: string, body: unknown) =>
    fetch(`${h.base}/v1/rewrite/${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${h.token()}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });

  async function expectReached(path: string, body: unknown, upstreamUrl: string) {
    const res = await post(path, body);
    expect(await res.text()).toContain('tok');
    expect(res.status).toBe(200);
    expect(h.lastUpstream().url).toBe(upstreamUrl);
  }

  // @anthropic-ai/sdk appends /v1/messages, @ai-sdk/anthropic /messages.
  it.each([
    'https://api.openai.com/v1/v1/messages',
    'https://api.openai.com/v1/messages',
    'https://api.openai.com/v1//v1/messages',
    'https://api.openai.com//v1/messages',
    'https://api.openai.com/messages',
    'api.openai.com/v1/messages',
  ])('an Anthropic client at %s reaches OpenAI at /v1/chat/completions', async (url) => {
    await expectReached(`anthropic/${url}`, ANTHROPIC_BODY, '/v1/chat/completions');
  });

  it.each([
    ['https://api.anthropic.com/v1/chat/completions', '/v1/messages'],
    ['https://api.anthropic.com/v1//chat/completions', '/v1/messages'],
    ['https://api.anthropic.com/chat/completions', '/v1/messages'],
    ['https://api.anthropic.com/v1/v1/chat/completions', '/v1/messages'],
    ['https://generativelanguage.googleapis.com/v1beta/chat/completions', '/v1beta/models/claude-haiku-4-5:generateContent'],
    ['https://generativelanguage.googleapis.com/chat/completions', '/v1beta/models/claude-haiku-4-5:generateContent'],
    ['https://generativelanguage.googleapis.com/v1/chat/completions', '/v1/models/claude-haiku-4-5:generateContent'],
  ])('an OpenAI client at %s reaches %s', async (url, upstreamUrl) => {
    await expectReached(`openai/${url}`, OPENAI_BODY, upstreamUrl);
  });

  // @google/genai appends /<apiVersion>/models/…: v1 by default with a base URL, v1beta when asked.
  it.each([
    ['https://api.anthropic.com/v1/v1/models/claude-haiku-4-5:generateContent', '/v1/messages'],
    ['https://api.anthropic.com/v1/v1beta/models/claude-haiku-4-5:generateContent', '/v1/messages'],
    ['https://api.anthropic.com/v1/models/claude-haiku-4-5:generateContent', '/v1/messages'],
    ['https://api.openai.com/v1beta/models/gpt-4o:streamGenerateContent?alt=sse', '/v1/chat/completions'],
  ])('a Google client at %s reaches %s', async (url, upstreamUrl) => {
    await expectReached(`google/${url}`, GOOGLE_BODY, upstreamUrl);
  });

  // Same format on both sides: forwarded, nothing translated, to the client's endpoint under the provider's base.
  it.each([
    ['openai/https://api.openai.com/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, '/v1/chat/completions'],
    ['openai/https://api.openai.com/v1/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, '/v1/chat/completions'],
    ['openai/https://api.openai.com/v1//responses', { model: 'gpt-4o', input: 'hi' }, '/v1/responses'],
    ['anthropic/https://api.anthropic.com/messages', ANTHROPIC_BODY, '/v1/messages'],
    ['anthropic/https://api.anthropic.com/v1/v1/messages', ANTHROPIC_BODY, '/v1/messages'],
    ['google/https://generativelanguage.googleapis.com/v1beta/v1/models/gemini-2.0-flash:generateContent', GOOGLE_BODY, '/v1/models/gemini-2.0-flash:generateContent'],
    ['google/https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse', GOOGLE_BODY, '/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse'],
  ])('the same format at %s is forwarded to %s', async (path, body, upstreamUrl) => {
    await expectReached(path, body, upstreamUrl);
  });

  it('a streamed Gemini call of the same format keeps alt=sse, so the answer is an event stream', async () => {
    const res = await post('google/https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse&metadata=%7B%22a%22%3A%221%22%7D', GOOGLE_BODY);
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    expect(await res.text()).toMatch(/^data: /);
    expect(h.lastUpstream().query.get('metadata')).toBeNull();
  });

  it.each([
    ['anthropic/https://api.openai.com/v2/messages', 'api.openai.com/v2'],
    ['openai/https://api.anthropic.com/v1/beta/chat/completions', 'api.anthropic.com/v1/beta'],
  ])('a base that is not the provider’s (%s) is refused before any provider call', async (path, named) => {
    const res = await post(path, path.startsWith('openai') ? OPENAI_BODY : ANTHROPIC_BODY);
    expect(res.status).toBe(400);
    const body = (await res.json()) as Record<string, unknown>;
    expect(JSON.stringify(body)).toContain(named);
    expect(h.upstream.requests).toHaveLength(0);
  });
});
