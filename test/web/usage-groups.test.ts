import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { usageGroups } from '../../src/storage/usage-groups.ts';
import { useTestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/** The usage page's groups on both engines: exact sums per model, meter and metadata value, largest first. */
describe.each(databasesUnderTest())('usage groups on %s', (dialect) => {
  const t = useTestApp(dialect);

  it('sums completed requests per group, exactly, the largest total first', async () => {
    const c = await t.customerWithMeter({ credit: '100' });
    const calls = [
      { request_id: 'g1', model: 'big', input_tokens: 5000, output_tokens: 5000, metadata: { team: 'a' } },
      { request_id: 'g2', model: 'small', input_tokens: 10, output_tokens: 1, metadata: { team: 'b' } },
      { request_id: 'g3', model: 'small', input_tokens: 20, output_tokens: 2 },
    ];
    for (const call of calls) {
      const res = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: t.auth(), payload: { customer_id: c.customerId, meter_slug: c.meterSlug, provider: 'openai', ...call } });
      expect(res.statusCode, res.body).toBe(201);
      await t.settledRecord(call.request_id, t.auth());
    }
    const records = (await t.app.inject({ method: 'GET', url: '/v1/requests?limit=100', headers: t.auth() })).json().data as { request_id: string; total_request_cost: string }[];
    const cost = (id: string) => parseMoney(records.find((r) => r.request_id === id)!.total_request_cost);
    const range = { from: '2000-01-01T00:00:00.000Z', before: '2999-01-01T00:00:00.000Z' };
    const merchantId = t.merchant.merchantId;

    const byModel = await usageGroups(t.storage, merchantId, { ...range, by: 'model' });
    // The meter charges per request: two small requests cost more than one big one.
    expect(byModel.map((g) => [g.key, g.requests, g.tokens, g.total])).toEqual([
      ['small', 2, 33n, cost('g2') + cost('g3')],
      ['big', 1, 10000n, cost('g1')],
    ]);
    const byMeter = await usageGroups(t.storage, merchantId, { ...range, by: 'meter' });
    expect(byMeter.map((g) => [g.key, g.requests])).toEqual([[c.meterId, 3]]);
    const byTeam = await usageGroups(t.storage, merchantId, { ...range, by: 'metadata', metadataKey: 'team' });
    expect(byTeam.map((g) => [g.key, g.requests, g.total]).sort()).toEqual([['a', 1, cost('g1')], ['b', 1, cost('g2')]]);
    expect(await usageGroups(t.storage, merchantId, { from: '2999-01-01T00:00:00.000Z', before: '2999-01-02T00:00:00.000Z', by: 'model' })).toEqual([]);
    expect(await usageGroups(t.storage, 'mer_other', { ...range, by: 'customer' })).toEqual([]);
  });
});
