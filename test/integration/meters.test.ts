import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const tieredMeter = {
  name: 'Chat tokens',
  rate_type: 'fixed',
  tier_type: 'tokens_1m',
  tiers: [
    { start: '0', rate: '2.5' },
    { start: 1_000_000, rate: '1.25' },
  ],
};

describe.each(databasesUnderTest())('meters on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const post = (body: unknown, key?: string) =>
    t.app.inject({ method: 'POST', url: '/v1/meters', headers: t.auth(key), payload: body as object });

  it('creates a meter with defaults, exact tier rates and a product secret', async () => {
    const res = await post(tieredMeter);
    expect(res.statusCode).toBe(201);
    const meter = res.json();
    expect(meter).toMatchObject({
      name: 'Chat tokens',
      meter_slug: 'chat-tokens',
      rate_type: 'fixed',
      tier_type: 'tokens_1m',
      token_basis: 'input+output',
      base_cost_payer: 'wallet',
      service_charge_payer: 'wallet',
      tiers: [
        { start: 0, rate: '2.5000000000', type: 'tokens_1m' },
        { start: 1000000, rate: '1.2500000000', type: 'tokens_1m' },
      ],
    });
    expect(meter.meter_id).toMatch(/^met_[0-9A-Z]{26}$/);
    expect(meter.product_id).toBe(meter.meter_id);
    expect(meter.product_secret).toMatch(/^mets_/);
  });

  it('gives a second meter with the same name a distinct slug, and refuses a taken explicit slug', async () => {
    const a = (await post({ ...tieredMeter, name: 'Same', meter_slug: 'same-slug' })).json();
    const b = (await post({ ...tieredMeter, name: 'Same slug' })).json();
    expect(b.meter_slug).not.toBe(a.meter_slug);
    const taken = await post({ ...tieredMeter, meter_slug: 'same-slug' });
    expect(taken.statusCode).toBe(409);
    expect(taken.json().error.code).toBe('meter_slug_taken');
  });

  it('retrieves, patches (replacing tiers) and deletes a meter', async () => {
    const created = (await post({ ...tieredMeter, name: 'Patch me' })).json();
    const url = `/v1/meters/${created.meter_id}`;
    const got = await t.app.inject({ method: 'GET', url, headers: t.auth() });
    expect(got.json()).toEqual(created);

    const patched = await t.app.inject({
      method: 'PATCH',
      url,
      headers: t.auth(),
      payload: { name: 'Patched', tiers: [{ start: '0', rate: '0.0000000001' }] },
    });
    expect(patched.statusCode).toBe(200);
    expect(patched.json()).toMatchObject({
      name: 'Patched',
      meter_slug: created.meter_slug,
      tiers: [{ start: 0, rate: '0.0000000001', type: 'tokens_1m' }],
    });

    const deleted = await t.app.inject({ method: 'DELETE', url, headers: t.auth() });
    expect(deleted.json()).toEqual({ id: created.meter_id, deleted: true });
    const gone = await t.app.inject({ method: 'GET', url, headers: t.auth() });
    expect(gone.statusCode).toBe(404);
    expect(gone.json().error.code).toBe('not_found');
  });

  it.each([
    ['first tier not at 0', { tiers: [{ start: '5', rate: '1' }] }, ['tiers', '0', 'start']],
    ['starts not ascending', { tiers: [{ start: '0', rate: '1' }, { start: '0', rate: '2' }] }, ['tiers', '1', 'start']],
    ['negative rate', { tiers: [{ start: '0', rate: '-1' }] }, ['tiers', '0', 'rate']],
    ['over-precise rate', { tiers: [{ start: '0', rate: '0.00000000001' }] }, ['tiers', '0', 'rate']],
    ['rate as a float', { tiers: [{ start: '0', rate: 0.1 }] }, ['tiers', '0', 'rate']],
    ['unknown rate_type', { rate_type: 'flat' }, ['rate_type']],
    ['unknown tier_type', { tier_type: 'tokens_1k' }, ['tier_type']],
    ['no tiers', { tiers: [] }, ['tiers']],
    ['name of wrong type', { name: 42 }, ['name']],
    ['40-digit rate', { tiers: [{ start: '0', rate: '1'.repeat(40) }] }, ['tiers', '0', 'rate']],
    ['rate one unit above the money maximum', { tiers: [{ start: '0', rate: '100000000.0000000001' }] }, ['tiers', '0', 'rate']],
    ['second tier rate above the maximum', { tiers: [{ start: '0', rate: '1' }, { start: '10', rate: '999999999' }] }, ['tiers', '1', 'rate']],
  ])('rejects %s with a validation error naming the field', async (_label, change, path) => {
    const res = await post({ ...tieredMeter, ...change });
    expect(res.statusCode).toBe(400);
    const { error } = res.json();
    expect(error.code).toBe('validation_error');
    expect(error.status).toBe(400);
    expect(error.issues.map((i: { path: string[] }) => i.path)).toContainEqual(path);
  });

  it('accepts a rate of exactly the money maximum, and refuses a larger one on PATCH, keeping the tiers', async () => {
    const created = await post({ ...tieredMeter, tiers: [{ start: 0, rate: '100000000' }] });
    expect(created.statusCode).toBe(201);
    expect(created.json().tiers[0].rate).toBe('100000000.0000000000');
    const url = `/v1/meters/${created.json().meter_id}`;

    const patched = await t.app.inject({
      method: 'PATCH',
      url,
      headers: t.auth(),
      payload: { tiers: [{ start: 0, rate: '1' }, { start: 5, rate: '1'.repeat(40) }] },
    });
    expect(patched.statusCode).toBe(400);
    const { error } = patched.json();
    expect(error.code).toBe('validation_error');
    expect(error.issues).toContainEqual({ path: ['tiers', '1', 'rate'], message: 'rate must be at most 100000000.0000000000' });
    const unchanged = await t.app.inject({ method: 'GET', url, headers: t.auth() });
    expect(unchanged.json().tiers).toEqual(created.json().tiers);
  });

  it.each([
    ['limit 0', '?limit=0', 'validation_error', ['limit']],
    ['limit 101', '?limit=101', 'validation_error', ['limit']],
    ['an unknown cursor', '?cursor=met_01ARZ3NDEKTSV4RRFFQ69G5FAV', 'invalid_cursor', null],
    ["another merchant's meter as cursor", 'OTHER', 'invalid_cursor', null],
  ] as const)('refuses a list with %s', async (_label, query, code, path) => {
    let qs: string = query;
    if (query === 'OTHER') {
      const other = await t.newMerchant();
      qs = `?cursor=${(await post(tieredMeter, other.secretKey)).json().meter_id}`;
    }
    const res = await t.app.inject({ method: 'GET', url: `/v1/meters${qs}`, headers: t.auth() });
    expect(res.statusCode).toBe(400);
    const { error } = res.json();
    expect(error.code).toBe(code);
    if (path) expect(error.issues.map((i: { path: string[] }) => i.path)).toContainEqual(path);
  });

  it('refuses malformed JSON on PATCH with invalid_json, leaving the meter unchanged', async () => {
    const created = (await post(tieredMeter)).json();
    const url = `/v1/meters/${created.meter_id}`;
    const res = await t.app.inject({
      method: 'PATCH',
      url,
      headers: { ...t.auth(), 'content-type': 'application/json' },
      payload: '{"name": "Renamed",',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toEqual({ error: { message: expect.any(String), code: 'invalid_json', status: 400 } });
    expect((await t.app.inject({ method: 'GET', url, headers: t.auth() })).json().name).toBe(created.name);
  });

  it('keeps meters private to their merchant', async () => {
    const created = (await post({ ...tieredMeter, name: 'Mine' })).json();
    const other = await t.newMerchant();
    const res = await t.app.inject({ method: 'GET', url: `/v1/meters/${created.meter_id}`, headers: t.auth(other.secretKey) });
    expect(res.statusCode).toBe(404);
    const list = await t.app.inject({ method: 'GET', url: '/v1/meters', headers: t.auth(other.secretKey) });
    expect(list.json()).toEqual({ data: [], has_more: false, next_cursor: null });
  });

  it('pages through meters newest first over real HTTP', async () => {
    const m = await t.newMerchant();
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push((await post({ ...tieredMeter, name: `Page ${i}` }, m.secretKey)).json().meter_id);
    }
    const base = await t.listen();
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const qs: string = cursor ? `?limit=2&cursor=${cursor}` : '?limit=2';
      const res = await fetch(`${base}/v1/meters${qs}`, { headers: t.auth(m.secretKey) });
      const page = (await res.json()) as { data: { meter_id: string }[]; has_more: boolean; next_cursor: string | null };
      seen.push(...page.data.map((d) => d.meter_id));
      cursor = page.next_cursor;
      expect(page.has_more).toBe(cursor !== null);
    } while (cursor);
    expect(seen).toEqual([...ids].reverse());
  });
});
