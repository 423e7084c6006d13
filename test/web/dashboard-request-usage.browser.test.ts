import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { signedInDashboard, type DashboardSession } from '../helpers/dashboard.ts';

/**
 * A request's detail page in real Chromium shows the parts of its usage billed inside another
 * count (cached input, cache writes, reasoning tokens) and, for a media call, its audio seconds
 * and the unit it was priced by — the numbers GET /v1/requests/{id} gives.
 */
describe('request detail page: usage details (Chromium)', () => {
  let d: DashboardSession;

  beforeAll(async () => {
    d = await signedInDashboard('usage@shop.example', {
      gateway: { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-openai-managed' } },
    });
    await creditWallet(d.t.storage, d.walletId, parseMoney('1'), new Date().toISOString());
  });
  afterAll(async () => {
    await d?.close();
  });

  const openai = () => new OpenAI({ apiKey: d.secretKey, baseURL: `${d.base}/v1`, maxRetries: 0 });

  it('shows reasoning, cached and cache-write tokens of a chat completion', async () => {
    d.upstream!.setNext({ path: '/chat/completions', reasoningTokens: 3, cachedTokens: 1 });
    const { response } = await openai()
      .chat.completions.create({ model: 'o3-mini', messages: [{ role: 'user', content: 'one two three' }], max_completion_tokens: 7 })
      .withResponse();
    const requestId = response.headers.get('x-tollgate-request-id')!;
    const record = await d.t.settledRecord(requestId, d.t.auth(d.secretKey));
    await d.visit(`/dashboard/requests/${requestId}`, 'request-detail-reasoning');
    expect(await d.page.textContent('#detail-reasoning')).toBe(String(record.model_usage.reasoning_tokens));
    expect(await d.page.textContent('#detail-reasoning')).toBe('3');
    expect(await d.page.textContent('#detail-cached')).toBe('1');
    expect(await d.page.textContent('#detail-cache-write')).toBe('0');
    expect(await d.page.textContent('main')).toContain('priced by tokens');
  });

  it('shows the audio seconds of a transcription and that it was priced per minute', async () => {
    const file = await toFile(Buffer.alloc(1024, 1), 'a.mp3', { type: 'audio/mpeg' });
    const { response } = await openai().audio.transcriptions.create({ file, model: 'whisper-1' }).withResponse();
    const requestId = response.headers.get('x-tollgate-request-id')!;
    await d.t.settledRecord(requestId, d.t.auth(d.secretKey));
    await d.visit(`/dashboard/requests/${requestId}`, 'request-detail-audio');
    expect(await d.page.textContent('#detail-seconds')).toBe('42');
    expect(await d.page.textContent('main')).toContain('priced by minutes');
  });
});
