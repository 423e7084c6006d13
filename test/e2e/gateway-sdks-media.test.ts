import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest, priceOverridesFile } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import { AUDIO_SECONDS, AUDIO_TOKENS_PER_SECOND, IMAGE_OUTPUT_TOKENS, type MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Media calls through the openai client, over /v1/forward and the drop-in endpoints, priced by
 * the unit their model is priced by. The merchant's own key pays the base cost alone. Prices:
 * whisper-1 from the bundled catalog (0.36 an hour: 0.006 a minute); gpt-4o-transcribe and
 * gpt-image-1 from the catalog per 1M tokens (2.5 in, 6 audio in, 10 out; 5 in / 40 out); tts-1 (per 1M
 * characters) and dall-e-3 (per image) from the operator's file, since the catalog has neither.
 * Every upload is AUDIO_SECONDS (42 s) long to the mock.
 */
const OVERRIDES = {
  'openai/tts-1': { perMillionCharacters: '15' },
  'openai/dall-e-3': { perImage: '0.04' },
};

describe.each(databasesUnderTest())('media calls priced by their unit on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-openai-managed' },
      env: { PRICE_OVERRIDES_FILE: priceOverridesFile(OVERRIDES) },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const balance = async () => (await findWallet(t.storage, t.merchant.walletId))!.balance;
  const viaForward = () => new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1/forward?u=https://api.openai.com/v1`, maxRetries: 0 });
  const viaDropIn = () => new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1`, maxRetries: 0 });
  const audio = () => toFile(Buffer.alloc(64 * 1024, 7), 'speech.mp3', { type: 'audio/mpeg' });
  const clients = [
    ['/v1/forward', viaForward],
    ['the drop-in endpoint', viaDropIn],
  ] as const;

  async function expectCharged(requestId: string | null, before: bigint, cost: string) {
    const record = await t.settledRecord(requestId);
    expect(record.status).toBe('completed');
    expect(record.cost).toBe(cost);
    expect(before - (await balance())).toBe(parseMoney(cost));
    return record;
  }

  for (const [route, client] of clients) {
    it(`${route}: whisper-1 transcription reads the model from the form and is priced per minute of audio (42 s = 0.0042)`, async () => {
      const before = await balance();
      const { data, response } = await client().audio.transcriptions.create({ file: await audio(), model: 'whisper-1' }).withResponse();
      expect(data.text).toBe('hello world');
      const seen = upstream.requests.at(-1)!;
      expect(seen.path).toBe('/v1/audio/transcriptions');
      expect(seen.form).toMatchObject({ model: 'whisper-1', file: String(64 * 1024) });
      const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0042000000');
      expect(record).toMatchObject({ provider: 'openai', model: 'whisper-1', endpoint: 'POST https://api.openai.com/v1/audio/transcriptions' });
      expect(record.model_usage).toMatchObject({ input_seconds: AUDIO_SECONDS, input_tokens: 0, price_unit: 'minutes', input_cost: '0.0042000000' });
    });

    it(`${route}: gpt-4o-transcribe is priced by the tokens its answer reports, its audio tokens at the audio price`, async () => {
      const before = await balance();
      const { response } = await client().audio.transcriptions.create({ file: await audio(), model: 'gpt-4o-transcribe' }).withResponse();
      // 420 audio input tokens × 6 (the catalog's audio input price, not its text 2.5) + 2 output tokens × 10, per 1M.
      const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0025400000');
      expect(record.model).toBe('gpt-4o-transcribe');
      expect(record.model_usage).toMatchObject({ input_tokens: AUDIO_SECONDS * AUDIO_TOKENS_PER_SECOND, output_tokens: 2, price_unit: 'tokens' });
    });

    it(`${route}: speech with tts-1 is priced per character of its input (11 × 15 per 1M)`, async () => {
      const before = await balance();
      const { data, response } = await client().audio.speech.create({ model: 'tts-1', voice: 'alloy', input: 'hello world' }).withResponse();
      expect(Buffer.from(await data.arrayBuffer()).length).toBe(11);
      const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0001650000');
      expect(record.model_usage).toMatchObject({ input_characters: 11, price_unit: 'characters' });
    });

    it(`${route}: dall-e-3 image generation is priced per image`, async () => {
      const before = await balance();
      const { data, response } = await client().images.generate({ model: 'dall-e-3', prompt: 'a red cat' }).withResponse();
      expect(data.data).toHaveLength(1);
      const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0400000000');
      expect(record.model_usage).toMatchObject({ output_images: 1, price_unit: 'images', output_cost: '0.0400000000' });
    });
  }

  it('verbose_json whisper transcription through /v1/forward: priced from its duration', async () => {
    const before = await balance();
    const { data, response } = await viaForward()
      .audio.transcriptions.create({ file: await audio(), model: 'whisper-1', response_format: 'verbose_json' })
      .withResponse();
    expect(data.duration).toBe(AUDIO_SECONDS);
    const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0042000000');
    expect(record.model_usage).toMatchObject({ input_seconds: AUDIO_SECONDS, price_unit: 'minutes' });
  });

  it('a translation through the drop-in endpoint is priced per minute', async () => {
    const before = await balance();
    const { response } = await viaDropIn().audio.translations.create({ file: await audio(), model: 'whisper-1' }).withResponse();
    expect(upstream.requests.at(-1)!.path).toBe('/v1/audio/translations');
    await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0042000000');
  });

  it('the drop-in endpoint routes openai/whisper-1 and sends the provider the bare model in the form, the file untouched', async () => {
    const before = await balance();
    const { response } = await viaDropIn().audio.transcriptions.create({ file: await audio(), model: 'openai/whisper-1' }).withResponse();
    const seen = upstream.requests.at(-1)!;
    expect(seen.form).toMatchObject({ model: 'whisper-1', file: String(64 * 1024) });
    expect(seen.body.includes(Buffer.alloc(64 * 1024, 7))).toBe(true);
    const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0042000000');
    expect(record.model).toBe('whisper-1');
  });

  it('gpt-image-1 generation of 2 images is priced by its reported tokens and counts its images', async () => {
    const before = await balance();
    const { data, response } = await viaForward().images.generate({ model: 'gpt-image-1', prompt: 'a red cat', n: 2 }).withResponse();
    expect(data.data).toHaveLength(2);
    // 3 prompt words × 5 + 2 × 272 output tokens × 40, per 1M.
    const record = await expectCharged(response.headers.get('x-tollgate-request-id'), before, '0.0217750000');
    expect(record.model_usage).toMatchObject({ input_tokens: 3, output_tokens: 2 * IMAGE_OUTPUT_TOKENS, output_images: 2, price_unit: 'tokens' });
  });
});
