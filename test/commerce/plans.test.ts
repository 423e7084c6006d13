import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('plans and credit bundles on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const post = (url: string, payload: unknown, key?: string) => t.app.inject({ method: 'POST', url, headers: t.auth(key), payload: payload as object });
  const get = (url: string, key?: string) => t.app.inject({ method: 'GET', url, headers: t.auth(key) });
  const meter = async (key?: string) =>
    (await post('/v1/meters', { name: 'Tokens', rate_type: 'fixed', tiers: [{ start: 0, rate: '1' }] }, key)).json().meter_id as string;

  it('creates a plan with its bundles and meters, included_credit defaulting to period_amount', async () => {
    const m = await t.newMerchant();
    const meterId = await meter(m.secretKey);
    const res = await post(
      '/v1/plans',
      {
        name: 'Pro',
        period_amount: '25.00',
        billing_interval: 'month',
        meter_ids: [meterId],
        credit_bundles: [
          { name: 'Small', cost: '5', credit_amount: '5' },
          { name: 'Large', cost: '18', credit_amount: '20' },
        ],
        default_auto_top_up_bundle_index: 1,
      },
      m.secretKey,
    );
    expect(res.statusCode).toBe(201);
    const plan = res.json();
    expect(plan).toMatchObject({
      name: 'Pro',
      merchant_id: m.merchantId,
      period_amount: '25.0000000000',
      included_credit: '25.0000000000',
      billing_interval: 'month',
      rollover_type: 'full',
      bundle_rollover_type: 'full',
      linked_meters: [{ meter_id: meterId, name: 'Tokens' }],
      credit_bundles: [
        { name: 'Small', cost: '5.0000000000', credit_amount: '5.0000000000' },
        { name: 'Large', cost: '18.0000000000', credit_amount: '20.0000000000' },
      ],
    });
    expect(plan.plan_id).toMatch(/^pln_/);
    expect(plan.default_auto_top_up_bundle_id).toBe(plan.credit_bundles[1].credit_bundle_id);
    expect((await get(`/v1/plans/${plan.plan_id}`, m.secretKey)).json()).toEqual(plan);

    const bundles = (await get(`/v1/credit_bundles?plan_id=${plan.plan_id}`, m.secretKey)).json();
    expect(bundles.data.map((b: { name: string }) => b.name)).toEqual(['Large', 'Small']);
    const large = (await get(`/v1/credit_bundles/${plan.default_auto_top_up_bundle_id}`, m.secretKey)).json();
    expect(large).toMatchObject({ plan_id: plan.plan_id, name: 'Large', cost: '18.0000000000', credit_amount: '20.0000000000' });
  });

  it('refuses unknown meters, a default bundle index out of range and malformed amounts with issues', async () => {
    const base = { name: 'X', period_amount: '1', billing_interval: 'day' };
    const unknownMeter = await post('/v1/plans', { ...base, meter_ids: ['met_nope'] });
    expect(unknownMeter.statusCode).toBe(400);
    expect(unknownMeter.json().error.issues).toEqual([{ path: ['meter_ids', '0'], message: 'no meter with id met_nope' }]);
    const badIndex = await post('/v1/plans', { ...base, credit_bundles: [], default_auto_top_up_bundle_index: 0 });
    expect(badIndex.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['default_auto_top_up_bundle_index'] }] });
    const badAmount = await post('/v1/plans', { ...base, period_amount: '1.12345678901' });
    expect(badAmount.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['period_amount'] }] });
    const badInterval = await post('/v1/plans', { ...base, billing_interval: 'fortnight' });
    expect(badInterval.json().error.issues[0].path).toEqual(['billing_interval']);
  });

  it('updates fields, replaces meters, and adds, changes and deletes bundles', async () => {
    const m = await t.newMerchant();
    const [a, b] = [await meter(m.secretKey), await meter(m.secretKey)];
    const plan = (
      await post(
        '/v1/plans',
        { name: 'Base', period_amount: '10', included_credit: '12', billing_interval: 'week', meter_ids: [a], credit_bundles: [{ name: 'One', cost: '1', credit_amount: '1' }] },
        m.secretKey,
      )
    ).json();
    const oneId = plan.credit_bundles[0].credit_bundle_id;
    const patch = (payload: unknown) => t.app.inject({ method: 'PATCH', url: `/v1/plans/${plan.plan_id}`, headers: t.auth(m.secretKey), payload: payload as object });

    const changed = await patch({
      name: 'Base v2',
      rollover_type: 'none',
      included_credit: '15',
      meter_ids: [b],
      credit_bundles: [{ credit_bundle_id: oneId, name: 'One+', cost: '2', credit_amount: '3' }, { name: 'Two', cost: '4', credit_amount: '5' }],
      default_auto_top_up_bundle_id: oneId,
    });
    expect(changed.statusCode).toBe(200);
    expect(changed.json()).toMatchObject({
      name: 'Base v2',
      rollover_type: 'none',
      bundle_rollover_type: 'full',
      included_credit: '15.0000000000',
      period_amount: '10.0000000000',
      linked_meters: [{ meter_id: b }],
      default_auto_top_up_bundle_id: oneId,
      credit_bundles: [{ credit_bundle_id: oneId, name: 'One+', cost: '2.0000000000' }, { name: 'Two' }],
    });

    const deleted = await patch({ credit_bundles: [{ credit_bundle_id: oneId, name: 'One+', cost: '2', credit_amount: '3', is_deleted: true }] });
    expect(deleted.json()).toMatchObject({ default_auto_top_up_bundle_id: null, credit_bundles: [{ name: 'Two' }] });
    expect((await get(`/v1/credit_bundles/${oneId}`, m.secretKey)).statusCode).toBe(404);

    const foreign = await patch({ credit_bundles: [{ credit_bundle_id: 'cb_other', name: 'x', cost: '1', credit_amount: '1' }] });
    expect(foreign.json().error.issues[0].path).toEqual(['credit_bundles', '0', 'credit_bundle_id']);
    const badDefault = await patch({ default_auto_top_up_bundle_id: oneId });
    expect(badDefault.json().error.issues[0].path).toEqual(['default_auto_top_up_bundle_id']);
  });

  it('lists newest first with a cursor, deletes, and keeps merchants apart', async () => {
    const m = await t.newMerchant();
    const ids: string[] = [];
    for (const name of ['A', 'B', 'C']) ids.push((await post('/v1/plans', { name, period_amount: '0', billing_interval: 'month' }, m.secretKey)).json().plan_id);
    const first = (await get('/v1/plans?limit=2', m.secretKey)).json();
    expect(first.data.map((p: { plan_id: string }) => p.plan_id)).toEqual([ids[2], ids[1]]);
    expect(first.has_more).toBe(true);
    const rest = (await get(`/v1/plans?limit=2&cursor=${first.next_cursor}`, m.secretKey)).json();
    expect(rest).toMatchObject({ data: [{ plan_id: ids[0] }], has_more: false, next_cursor: null });

    expect((await get(`/v1/plans/${ids[0]}`)).statusCode).toBe(404);
    const del = await t.app.inject({ method: 'DELETE', url: `/v1/plans/${ids[0]}`, headers: t.auth(m.secretKey) });
    expect(del.json()).toEqual({ id: ids[0], deleted: true });
    expect((await get(`/v1/plans/${ids[0]}`, m.secretKey)).json().error.code).toBe('not_found');
    expect((await get('/v1/plans', m.secretKey)).json().data).toHaveLength(2);
  });

  it('documents the plan and credit bundle endpoints in the OpenAPI document', async () => {
    const doc = (await t.app.inject({ method: 'GET', url: '/v1/openapi.json' })).json();
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/v1/plans', '/v1/plans/{id}', '/v1/credit_bundles', '/v1/credit_bundles/{id}']));
    expect(Object.keys(doc.paths['/v1/plans/{id}'])).toEqual(expect.arrayContaining(['get', 'patch', 'delete']));
  });
});
