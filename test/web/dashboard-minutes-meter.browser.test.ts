import { describe, expect, it } from 'vitest';
import { exactText, useSignedInDashboard, tableRows } from '../helpers/dashboard.ts';

const PER_MINUTE = { name: 'Voice', rate_type: 'fixed', tier_type: 'minutes', tiers: [{ start: 0, rate: '0.05' }] };

/**
 * A per-minute (voice) meter in real Chromium: a request recorded in seconds shows its seconds,
 * not zero tokens, in the log and the detail; the meter's price preview starts from ten minutes,
 * a call's length, and prices it as the API would.
 */
describe('dashboard with a per-minute meter (Chromium)', () => {
  const d = useSignedInDashboard('voice@shop.example');
  let meterId: string;

  it('shows a voice request in seconds, without token rows', async () => {
    const c = await d.t.customerWithMeter({ credit: '10', meter: PER_MINUTE, secretKey: d.secretKey });
    meterId = c.meterId;
    const res = await d.api('POST', '/v1/requests', { request_id: 'call-1', customer_id: c.customerId, meter_slug: c.meterSlug, input_seconds: 60, output_seconds: 30 });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    const record = await d.t.settledRecord('call-1', d.t.auth(d.secretKey));
    expect(record.fee.amount).toBe('0.0750000000');

    await d.visit('/dashboard/requests', 'requests-voice');
    const [row] = await tableRows(d.page, 'table');
    expect(row![0]).toBe('call-1');
    expect(row![4]).toBe('90 s');

    await d.visit('/dashboard/requests/call-1', 'request-detail-voice');
    expect(await d.page.textContent('#detail-seconds')).toBe('90');
    const main = (await d.page.textContent('main')) ?? '';
    expect(main).toContain('(input 60, output 30)');
    expect(main).not.toContain('Input tokens');
    expect(await exactText(d.page, '#detail-fee')).toContain(record.fee.amount);
  });

  it('previews the price of ten minutes by default', async () => {
    await d.visit(`/dashboard/meters/${meterId}`, 'meter-voice');
    expect(await d.page.getByLabel(/Usage of one request/).inputValue()).toBe('10');
    expect(await exactText(d.page, '#preview-fee')).toBe('0.5000000000');
  });
});
