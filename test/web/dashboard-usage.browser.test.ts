import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { signedInDashboard, tableValues, type DashboardSession } from '../helpers/dashboard.ts';

/**
 * Usage grouped by model, customer, meter and a metadata key in real Chromium, each group's
 * figures the sums of GET /v1/requests, and the same view as CSV.
 */
describe('dashboard usage by group (Chromium)', () => {
  let d: DashboardSession;
  let records: { request_id: string; model: string | null; customer_id: string; metadata: Record<string, string>; fee: { amount: string }; total_request_cost: string }[];
  let today: string;

  beforeAll(async () => {
    d = await signedInDashboard('usage@shop.example');
    const a = await d.t.customerWithMeter({ credit: '100', secretKey: d.secretKey });
    const b = (await d.api('POST', '/v1/customers', { email: 'bea@example.com' })).body;
    await d.api('POST', `/v1/customers/${b.customer_id}/credits`, { amount: '100' });
    const calls = [
      { request_id: 'u1', customer_id: a.customerId, provider: 'openai', model: 'gpt-4o-mini', input_tokens: 3000, output_tokens: 1000, metadata: { team: 'search' } },
      { request_id: 'u2', customer_id: a.customerId, provider: 'openai', model: 'gpt-4o-mini', input_tokens: 500, output_tokens: 100, metadata: { team: 'ads' } },
      { request_id: 'u3', customer_id: b.customer_id, input_tokens: 10, output_tokens: 5, metadata: { team: 'search' } },
      { request_id: 'u4', customer_id: b.customer_id, input_tokens: 10, output_tokens: 5 },
    ];
    for (const call of calls) {
      const res = await d.api('POST', '/v1/requests', { meter_slug: a.meterSlug, ...call });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      await d.t.settledRecord(call.request_id, d.t.auth(d.secretKey));
    }
    records = (await d.api('GET', '/v1/requests?limit=100')).body.data;
    today = new Date(d.t.clock.now()).toISOString().slice(0, 10);
  });
  afterAll(async () => {
    await d?.close();
  });

  const expected = (keyOf: (r: (typeof records)[number]) => string | undefined | null) => {
    const sums = new Map<string, { requests: number; fee: bigint; total: bigint }>();
    for (const r of records) {
      const key = keyOf(r);
      if (key === undefined) continue;
      const s = sums.get(key ?? '') ?? { requests: 0, fee: 0n, total: 0n };
      sums.set(key ?? '', { requests: s.requests + 1, fee: s.fee + parseMoney(r.fee.amount), total: s.total + parseMoney(r.total_request_cost) });
    }
    return sums;
  };
  const check = (rows: string[][], sums: ReturnType<typeof expected>, keyOfRow: (row: string[]) => string) => {
    expect(rows).toHaveLength(sums.size);
    for (const row of rows) {
      const s = sums.get(keyOfRow(row))!;
      expect([Number(row[2]), parseMoney(row[4]!), parseMoney(row[5]!)]).toEqual([s.requests, s.fee, s.total]);
    }
  };

  it('groups by model, customer and metadata key with the sums of the records', async () => {
    await d.visit(`/dashboard/usage?from=${today}&to=${today}&by=model`, 'usage-model');
    check(await tableValues(d.page, '#usage-groups'), expected((r) => r.model), (row) => (row[0] === 'none given' ? '' : row[0]!));

    await d.visit(`/dashboard/usage?from=${today}&to=${today}&by=customer`, 'usage-customer');
    const links = await d.page.$$eval('#usage-groups tbody th a', (as) => as.map((a) => a.getAttribute('title')!));
    const rows = await tableValues(d.page, '#usage-groups');
    check(rows, expected((r) => r.customer_id), (row) => links[rows.indexOf(row)]!);
    expect(rows.map((r) => r[0])).toContain('bea@example.com');

    await d.visit(`/dashboard/usage?from=${today}&to=${today}&by=metadata&key=team`, 'usage-metadata');
    check(await tableValues(d.page, '#usage-groups'), expected((r) => r.metadata.team), (row) => row[0]!);
  });

  it('exports the view it shows as CSV', async () => {
    const csv = await d.page.request.get(`${d.base}/dashboard/usage.csv?from=${today}&to=${today}&by=metadata&key=team`);
    expect(csv.headers()['content-type']).toContain('text/csv');
    const lines = (await csv.text()).split('\r\n').filter(Boolean);
    expect(lines[0]).toBe('metadata.team,name,requests,tokens,fee,total_request_cost,from,to');
    const sums = expected((r) => r.metadata.team);
    expect(lines.slice(1).map((l) => l.split(',')).map((c) => [c[0], Number(c[2]), parseMoney(c[5]!)]).sort()).toEqual(
      [...sums].map(([k, s]) => [k, s.requests, s.total]).sort(),
    );
  });
});
