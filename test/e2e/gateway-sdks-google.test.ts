import { GoogleGenAI } from '@google/genai';
import { describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import { normalise, sseData, useSdkGateway } from '../helpers/sdk-gateway.ts';

/**
 * @google/genai 3 drives the forward gateway over real HTTP (see sdk-gateway.ts for the billing
 * modes and the hand-worked costs): generateContent, generateContentStream, the published base
 * URL, and a caller's own provider key.
 *
 * How the client is pointed at the gateway:
 * `httpOptions.baseUrl: <base>/v1/forward?u=https://generativelanguage.googleapis.com` (the client
 * appends `/v1/models/...`), or `lava.providers.google` (the doubled version is collapsed to the
 * client's). The apiKey goes out as x-goog-api-key. generateContentStream's path carries
 * `?alt=sse`, and the client adds `alt=sse` next to `u` too: the provider gets it once.
 */

describe.each(databasesUnderTest())('official SDKs through the forward gateway on %s', (dialect) => {
  const h = useSdkGateway(dialect);
  const { lava, meter, customer, customerToken, balances, direct, lastUpstream, expectBilled, expectNoTollgateCredential } = h;

  describe('@google/genai client', () => {
    const genai = (apiKey: string, httpOptions: { baseUrl: string; apiVersion?: string } = { baseUrl: `${h.base}/v1/forward?u=https://generativelanguage.googleapis.com` }) =>
      new GoogleGenAI({ apiKey, httpOptions });
    const pick = (r: unknown) => {
      const { candidates, usageMetadata, modelVersion, responseId } = r as Record<string, unknown>;
      return { candidates, usageMetadata, modelVersion, responseId };
    };

    it('generateContent with the forward token as apiKey (x-goog-api-key): the exact answer; customer pays', async () => {
      const token = customerToken();
      const before = await balances();
      const result = await genai(token).models.generateContent({
        model: 'gemini-2.0-flash',
        contents: 'what is one plus one',
        config: { maxOutputTokens: 3 },
      });
      const seen = lastUpstream();
      // @google/genai 3 asks for API version v1 unless told otherwise.
      expect(seen.path).toBe('/v1/models/gemini-2.0-flash:generateContent');
      expect(seen.headers['x-goog-api-key']).toBe('goog-managed');
      expect(seen.query.get('key')).toBeNull();
      expectNoTollgateCredential(seen, token);
      const provided = JSON.parse((await direct(seen)).text) as unknown;
      expect(normalise(pick(result))).toEqual(normalise(provided));
      expect(result.text).toBe('tok tok tok');
      expect(result.usageMetadata).toMatchObject({ promptTokenCount: 5, candidatesTokenCount: 3 });

      // The client exposes the response headers on every result.
      const requestId = result.sdkHttpResponse?.headers?.['x-tollgate-request-id'];
      expect(requestId).toMatch(/^req_/);
      const record = await expectBilled(requestId!, before, {
        billing: 'customer',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 5,
        outputTokens: 3,
        customerId: customer.customer_id,
        // base 5/1M + 12/1M = 0.000017; fee 8 × 100/1M = 0.0008
        totalRequestCost: '0.0008170000',
      });
      expect(record.endpoint).toBe('POST https://generativelanguage.googleapis.com/v1/models/gemini-2.0-flash:generateContent');
    });

    it('generateContentStream: every chunk the provider sent (alt=sse reaches it); usage from the last chunk', async () => {
      const token = customerToken();
      const before = await balances();
      const stream = await genai(token).models.generateContentStream({
        model: 'gemini-2.0-flash',
        contents: [{ role: 'user', parts: [{ text: 'stream four words' }] }],
        config: { maxOutputTokens: 4 },
      });
      const chunks: unknown[] = [];
      let text = '';
      let requestId: string | undefined;
      for await (const chunk of stream) {
        chunks.push(pick(chunk));
        text += chunk.text ?? '';
        requestId ??= chunk.sdkHttpResponse?.headers?.['x-tollgate-request-id'];
      }
      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/models/gemini-2.0-flash:streamGenerateContent');
      // The client puts alt=sse both inside u and beside it: the provider gets it once.
      expect(seen.query.getAll('alt')).toEqual(['sse']);
      const answer = await direct(seen);
      expect(answer.contentType).toContain('text/event-stream');
      expect(normalise(chunks)).toEqual(normalise(sseData(answer.text)));
      expect(text).toBe('tok tok tok tok');

      expect(requestId).toMatch(/^req_/);
      await expectBilled(requestId!, before, {
        billing: 'customer',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 3,
        outputTokens: 4,
        // base 3/1M + 16/1M = 0.000019; fee 7 × 100/1M = 0.0007
        totalRequestCost: '0.0007190000',
      });
    });

    it("lava.providers.google works as baseUrl: the client's API version replaces the base's", async () => {
      const token = customerToken();
      const before = await balances();
      const client = genai(token, { baseUrl: lava.providers.google, apiVersion: 'v1beta' });
      const result = await client.models.generateContent({ model: 'gemini-2.0-flash', contents: 'hi', config: { maxOutputTokens: 1 } });
      const seen = lastUpstream();
      // …/v1beta (the published base) + /v1beta/models/… (the client's path) is one /v1beta.
      expect(seen.path).toBe('/v1beta/models/gemini-2.0-flash:generateContent');
      expect(normalise(pick(result))).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(result.sdkHttpResponse!.headers!['x-tollgate-request-id']!, before, {
        billing: 'customer',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 1,
        outputTokens: 1,
        // base 1/1M + 4/1M = 0.000005; fee 2 × 100/1M = 0.0002
        totalRequestCost: '0.0002050000',
      });
    });

    it('unmanaged: provider_key reaches Gemini in x-goog-api-key', async () => {
      const token = lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug, provider_key: 'goog-caller' });
      const before = await balances();
      const result = await genai(token).models.generateContent({ model: 'gemini-2.0-flash', contents: 'own key here', config: { maxOutputTokens: 2 } });
      const seen = lastUpstream();
      expect(seen.headers['x-goog-api-key']).toBe('goog-caller');
      expectNoTollgateCredential(seen, token);
      expect(normalise(pick(result))).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(result.sdkHttpResponse!.headers!['x-tollgate-request-id']!, before, {
        billing: 'customer_unmanaged',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 3,
        outputTokens: 2,
        // fee 5 × 100/1M; base (3/1M + 8/1M) shown, not charged
        totalRequestCost: '0.0005000000',
      });
    });
  });
});
