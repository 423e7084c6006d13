import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { signedInDashboard, type DashboardSession } from '../helpers/dashboard.ts';

type Window = { __plots?: { scales: { x: { min: number; max: number } } }[] };

/**
 * The overview charts' time axis spans the chosen days (half a day of margin each side) in real
 * Chromium, also for a range of a single day. The chart instances are caught as the page makes
 * them, by wrapping the chart library's global before it loads.
 */
describe('overview chart time axis (Chromium)', () => {
  let d: DashboardSession;
  const today = new Date().toISOString().slice(0, 10);
  const day = (iso: string) => Date.parse(`${iso}T12:00:00Z`) / 1000;

  beforeAll(async () => {
    d = await signedInDashboard('chart@shop.example');
    await d.context.addInitScript(() => {
      const w = window as unknown as Record<string, unknown> & Window;
      let wrapped: unknown;
      Object.defineProperty(w, 'uPlot', {
        configurable: true,
        get: () => wrapped,
        set(real: new (...args: unknown[]) => NonNullable<Window['__plots']>[number]) {
          const capture = function (...args: unknown[]) {
            const plot = new real(...args);
            (w.__plots ??= []).push(plot);
            return plot;
          };
          wrapped = Object.assign(capture, real);
        },
      });
    });
    const c = await d.t.customerWithMeter({ credit: '10', secretKey: d.secretKey });
    const res = await d.api('POST', '/v1/requests', { request_id: 'chart-1', customer_id: c.customerId, meter_slug: c.meterSlug, input_tokens: 10, output_tokens: 5 });
    expect(res.status).toBe(201);
    await d.t.settledRecord('chart-1', d.t.auth(d.secretKey));
  });
  afterAll(async () => {
    await d?.close();
  });

  const xScales = async (start: string, end: string) => {
    await d.page.goto(`${d.base}/dashboard?start=${start}&end=${end}&tz=%2B00:00`);
    await d.page.waitForFunction(() => ((window as unknown as Window).__plots ?? []).length === 2);
    return d.page.evaluate(() => (window as unknown as Window).__plots!.map((p) => [p.scales.x.min, p.scales.x.max]));
  };

  it('spans one day for a one-day range, not years', async () => {
    const scales = await xScales(today, today);
    expect(scales).toEqual([
      [day(today) - 43200, day(today) + 43200],
      [day(today) - 43200, day(today) + 43200],
    ]);
  });

  it('spans exactly the chosen days for a longer range', async () => {
    const start = new Date(Date.now() - 6 * 86_400_000).toISOString().slice(0, 10);
    const scales = await xScales(start, today);
    for (const [min, max] of scales) {
      expect(min).toBe(day(start) - 43200);
      expect(max).toBe(day(today) + 43200);
    }
  });
});
