import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import { TRANSCRIPT_SECONDS, type MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * ElevenLabs through /v1/forward with its own credential header (xi-api-key): text-to-speech is
 * billed by the characters of its text on a characters_1m meter, speech-to-text by the seconds of
 * its transcript on a minutes meter. The catalog has no token prices for these models, so the
 * base cost is 0 and the customer pays the meter's fee alone.
 */
describe.each(databasesUnderTest())('ElevenLabs billing on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let customer: { customer_id: string; wallet: { wallet_id: string } };

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.elevenlabs.io'],
      providerKeys: { elevenlabs: 'xi-managed' },
    }));
    customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: {} })).json();
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  async function meterToken(tierType: 'characters_1m' | 'minutes', rate: string): Promise<string> {
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: t.auth(),
        payload: { name: `Voice ${tierType}`, rate_type: 'fixed', tier_type: tierType, tiers: [{ start: '0', rate }] },
      })
    ).json() as { meter_slug: string };
    return forwardToken(t.merchant.secretKey, customer.customer_id, meter.meter_slug);
  }

  const balance = async () => (await findWallet(t.storage, customer.wallet.wallet_id))!.balance;

  it('text-to-speech bills the characters of its text (code points) on a characters_1m meter', async () => {
    const token = await meterToken('characters_1m', '30');
    const before = await balance();
    const text = 'Hello, world! 👋'; // 14 characters and one emoji: 15 code points
    const target = 'https://api.elevenlabs.io/v1/text-to-speech/voice123';
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(target)}`, {
      method: 'POST',
      headers: { 'xi-api-key': token, 'content-type': 'application/json' },
      body: JSON.stringify({ text, model_id: 'eleven_multilingual_v2' }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('audio/mpeg');
    expect((await res.arrayBuffer()).byteLength).toBe(15);
    expect(upstream.requests.at(-1)!.headers['xi-api-key']).toBe('xi-managed');

    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({
      status: 'completed',
      provider: 'elevenlabs',
      model: 'eleven_multilingual_v2',
      usage_estimated: false,
      model_usage: { input_characters: 15, output_characters: 0, total_characters: 15, input_tokens: 0, total_cost: '0.0000000000' },
    });
    // 15 characters × 30 per 1M characters = 0.00045
    expect(record.fee.amount).toBe('0.0004500000');
    expect(record.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '30.0000000000', type: 'characters_1m' }, tokens: 0, characters: 15, seconds: 0, cost: '0.0004500000' },
    ]);
    expect(before - (await balance())).toBe(parseMoney(record.total_wallet_cost));
    const serviceOnWallet = record.service_charge.payer === 'wallet' ? parseMoney(record.service_charge.amount) : 0n;
    expect(parseMoney(record.total_wallet_cost)).toBe(parseMoney('0.00045') + serviceOnWallet);
  });

  it('speech-to-text bills the seconds of its transcript on a minutes meter', async () => {
    const token = await meterToken('minutes', '0.4');
    const before = await balance();
    const form = new FormData();
    form.append('model_id', 'scribe_v1');
    form.append('file', new Blob([new Uint8Array(2048)], { type: 'audio/mpeg' }), 'clip.mp3');
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.elevenlabs.io/v1/speech-to-text')}`, {
      method: 'POST',
      headers: { 'xi-api-key': token },
      body: form,
    });
    expect(res.status).toBe(200);
    const transcript = (await res.json()) as { transcription_id: string };
    expect(upstream.requests.at(-1)!.headers['content-type']).toMatch(/^multipart\/form-data; boundary=/);

    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id'));
    expect(TRANSCRIPT_SECONDS).toBe(90.25);
    expect(record).toMatchObject({
      status: 'completed',
      provider: 'elevenlabs',
      response_id: transcript.transcription_id,
      usage_estimated: false,
      model_usage: { input_seconds: 90.25, output_seconds: 0, total_seconds: 90.25, input_characters: 0 },
    });
    // 90.25 s = 1.504166… minutes × 0.4 = 0.60166666666… → 0.6016666667 (half-up at 1e-10)
    expect(record.fee.amount).toBe('0.6016666667');
    expect(record.fee.breakdown[0]).toMatchObject({ seconds: 90.25, cost: '0.6016666667' });
    expect(before - (await balance())).toBe(parseMoney(record.total_wallet_cost));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
