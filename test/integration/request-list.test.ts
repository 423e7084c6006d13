import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { RequestRecord } from '../../src/services/requests.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Page = { data: RequestRecord[]; has_more: boolean; next_cursor: string | null };

/** A merchant of its own per test: two customers, a free meter and a per-request meter. */
type World = {
  merchant: Merchant;
  customers: [string, string];
  meters: { free: { id: string; slug: string }; paid: { id: string; slug: string } };
};

describe.each(databasesUnderTest())('GET /v1/requests on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const post = (m: Merchant, url: string, payload: object) =>
    t.app.inject({ method: 'POST', url, headers: t.auth(m.secretKey), payload });

  async function world(): Promise<World> {
    const merchant = await t.newMerchant();
    const customer = async () => {
      const c = (await post(merchant, '/v1/customers', {})).json();
      await creditWallet(t.storage, c.wallet.wallet_id, parseMoney('100'), new Date().toISOString());
      return c.customer_id as string;
    };
    const meter = async (name: string, rate: string) => {
      const m = (await post(merchant, '/v1/meters', { name, rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: '0', rate }] })).json();
      return { id: m.meter_id as string, slug: m.meter_slug as string };
    };
    return {
      merchant,
      customers: [await customer(), await customer()],
      meters: { free: await meter('Free', '0'), paid: await meter('Paid', '0.25') },
    };
  }

  async function record(
    w: World,
    request_id: string,
    opts: { customer?: string; meter?: string; metadata?: Record<string, string> } = {},
  ): Promise<RequestRecord> {
    const res = await post(w.merchant, '/v1/requests', {
      request_id,
      customer_id: opts.customer ?? w.customers[0],
      meter_slug: opts.meter ?? w.meters.free.slug,
      input_tokens: 10,
      output_tokens: 5,
      ...(opts.metadata ? { metadata: opts.metadata } : {}),
    });
    expect(res.statusCode).toBe(201);
    return res.json();
  }

  const list = (w: World, query = '') =>
    t.app.inject({ method: 'GET', url: `/v1/requests${query ? `?${query}` : ''}`, headers: t.auth(w.merchant.secretKey) });

  async function listIds(w: World, query = ''): Promise<string[]> {
    const res = await list(w, query);
    expect(res.statusCode).toBe(200);
    return (res.json() as Page).data.map((r) => r.request_id);
  }

  /** Follows next_cursor to the end and returns every page. */
  async function allPages(w: World, query: string): Promise<Page[]> {
    const pages: Page[] = [];
    let cursor: string | null = null;
    do {
      const res = await list(w, [query, cursor ? `cursor=${encodeURIComponent(cursor)}` : ''].filter(Boolean).join('&'));
      expect(res.statusCode).toBe(200);
      const page = res.json() as Page;
      pages.push(page);
      cursor = page.next_cursor;
    } while (cursor !== null && pages.length < 50);
    return pages;
  }

  const filters = (pairs: unknown) => `metadata_filters=${encodeURIComponent(JSON.stringify(pairs))}`;

  it('lists newest first and pages with the request_id of the last item as cursor', async () => {
    const w = await world();
    const created: RequestRecord[] = [];
    for (let i = 1; i <= 5; i++) created.push(await record(w, `order-${i}`));

    const pages = await allPages(w, 'limit=2');
    expect(pages.map((p) => p.data.map((r) => r.request_id))).toEqual([
      ['order-5', 'order-4'],
      ['order-3', 'order-2'],
      ['order-1'],
    ]);
    expect(pages.map((p) => [p.has_more, p.next_cursor])).toEqual([
      [true, 'order-4'],
      [true, 'order-2'],
      [false, null],
    ]);
    // A list item is the same record GET /requests/{id} and POST /requests return.
    expect(pages.flatMap((p) => p.data)).toEqual([...created].reverse());
  });

  it('pages by caller-chosen request_ids of any allowed length and shape', async () => {
    const w = await world();
    const long = `x${'y'.repeat(200)}`;
    for (const id of ['b/with slash', long, 'a?&=#']) await record(w, id);
    const pages = await allPages(w, 'limit=1');
    expect(pages.flatMap((p) => p.data.map((r) => r.request_id))).toEqual(['a?&=#', long, 'b/with slash']);
  });

  it('shows 10 records by default and at most 100', async () => {
    const w = await world();
    for (let i = 0; i < 12; i++) await record(w, `default-${i}`);
    const first = (await list(w)).json() as Page;
    expect(first.data).toHaveLength(10);
    expect(first).toMatchObject({ has_more: true, next_cursor: 'default-2' });
    const all = (await list(w, 'limit=100')).json() as Page;
    expect(all).toMatchObject({ has_more: false, next_cursor: null });
    expect(all.data).toHaveLength(12);
  });

  it.each(['limit=0', 'limit=101', 'limit=abc', 'limit=1.5'])('refuses %s with 400 validation_error', async (query) => {
    const w = await world();
    const res = await list(w, query);
    expect(res.statusCode).toBe(400);
    expect(res.json().error).toMatchObject({ code: 'validation_error', issues: [expect.objectContaining({ path: ['limit'] })] });
  });

  it('refuses a cursor that names no record of this merchant with 400 invalid_cursor', async () => {
    const w = await world();
    const other = await world();
    await record(w, 'mine');
    await record(other, 'theirs');
    for (const cursor of ['nope', 'theirs']) {
      const res = await list(w, `cursor=${cursor}`);
      expect(res.statusCode).toBe(400);
      expect(res.json().error).toMatchObject({ code: 'invalid_cursor', issues: [{ path: ['cursor'] }] });
    }
    expect(await listIds(other)).toEqual(['theirs']);
  });

  it('filters by customer (connection_id or customer_id) and by meter (product_id or meter_id)', async () => {
    const w = await world();
    const [c1, c2] = w.customers;
    await record(w, 'c1-free', { customer: c1 });
    await record(w, 'c2-free', { customer: c2 });
    await record(w, 'c1-paid', { customer: c1, meter: w.meters.paid.slug });
    await record(w, 'c2-paid', { customer: c2, meter: w.meters.paid.slug });

    expect(await listIds(w, `customer_id=${c1}`)).toEqual(['c1-paid', 'c1-free']);
    expect(await listIds(w, `connection_id=${c1}`)).toEqual(['c1-paid', 'c1-free']);
    expect(await listIds(w, `meter_id=${w.meters.paid.id}`)).toEqual(['c2-paid', 'c1-paid']);
    expect(await listIds(w, `product_id=${w.meters.paid.id}`)).toEqual(['c2-paid', 'c1-paid']);
    expect(await listIds(w, `customer_id=${c2}&meter_id=${w.meters.free.id}`)).toEqual(['c2-free']);
    expect(await listIds(w, `customer_id=${c2}&connection_id=${c2}`)).toEqual(['c2-paid', 'c2-free']);
    expect(await listIds(w, 'customer_id=con_unknown')).toEqual([]);
  });

  it('refuses both names of one filter naming different things', async () => {
    const w = await world();
    const [c1, c2] = w.customers;
    const res = await list(w, `customer_id=${c1}&connection_id=${c2}`);
    expect(res.statusCode).toBe(400);
    expect(res.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['customer_id'] }] });
    const meters = await list(w, `meter_id=${w.meters.free.id}&product_id=${w.meters.paid.id}`);
    expect(meters.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['meter_id'] }] });
  });

  it('ANDs metadata_filters pairs, alone and with the other filters, across pages', async () => {
    const w = await world();
    const [c1, c2] = w.customers;
    await record(w, 'a-prod-1', { metadata: { team: 'a', env: 'prod' } });
    await record(w, 'a-dev', { metadata: { team: 'a', env: 'dev' } });
    await record(w, 'b-prod', { metadata: { team: 'b', env: 'prod' } });
    await record(w, 'none');
    await record(w, 'a-prod-2', { customer: c2, metadata: { team: 'a', env: 'prod', extra: 'x' } });
    await record(w, 'a-only', { metadata: { team: 'a' } });

    expect(await listIds(w, filters([['team', 'a']]))).toEqual(['a-only', 'a-prod-2', 'a-dev', 'a-prod-1']);
    expect(await listIds(w, filters([['env', 'prod']]))).toEqual(['a-prod-2', 'b-prod', 'a-prod-1']);
    expect(await listIds(w, filters([['team', 'a'], ['env', 'prod']]))).toEqual(['a-prod-2', 'a-prod-1']);
    expect(await listIds(w, filters([['env', 'prod'], ['team', 'a']]))).toEqual(['a-prod-2', 'a-prod-1']);
    expect(await listIds(w, filters([['team', 'a'], ['env', 'prod'], ['extra', 'x']]))).toEqual(['a-prod-2']);
    expect(await listIds(w, filters([['team', 'a'], ['team', 'b']]))).toEqual([]);
    expect(await listIds(w, filters([['team', 'c']]))).toEqual([]);
    expect(await listIds(w, filters([['Team', 'a']]))).toEqual([]); // keys are case-sensitive
    expect(await listIds(w, filters([]))).toHaveLength(6);
    expect(await listIds(w, `customer_id=${c1}&${filters([['team', 'a'], ['env', 'prod']])}`)).toEqual(['a-prod-1']);

    const pages = await allPages(w, `limit=1&${filters([['team', 'a']])}`);
    expect(pages.map((p) => p.data.map((r) => r.request_id))).toEqual([['a-only'], ['a-prod-2'], ['a-dev'], ['a-prod-1']]);
    expect(pages.map((p) => p.next_cursor)).toEqual(['a-only', 'a-prod-2', 'a-dev', null]);
    // A cursor may name a record the filter does not match: paging continues after its position.
    expect(await listIds(w, `cursor=none&${filters([['team', 'a']])}`)).toEqual(['a-dev', 'a-prod-1']);
  });

  it.each([
    ['not JSON', 'team=a', ['metadata_filters']],
    ['an object instead of pairs', JSON.stringify({ team: 'a' }), ['metadata_filters']],
    ['a pair missing its value', JSON.stringify([['team']]), ['metadata_filters', '0']],
    ['a pair with three members', JSON.stringify([['team', 'a', 'b']]), ['metadata_filters', '0']],
    ['a key with a hyphen', JSON.stringify([['cost-center', 'x']]), ['metadata_filters', '0', '0']],
    ['an empty key', JSON.stringify([['', 'x']]), ['metadata_filters', '0', '0']],
    ['a number value', JSON.stringify([['team', 1]]), ['metadata_filters', '0', '1']],
    ['a value over 255 characters', JSON.stringify([['team', 'v'.repeat(256)]]), ['metadata_filters', '0', '1']],
  ])('refuses metadata_filters that is %s with 400 and issues under metadata_filters', async (_name, value, path) => {
    const w = await world();
    const res = await list(w, `metadata_filters=${encodeURIComponent(value)}`);
    expect(res.statusCode).toBe(400);
    const error = res.json().error;
    expect(error.code).toBe('invalid_metadata');
    expect(error.issues.map((i: { path: string[] }) => i.path)).toContainEqual(path);
  });

  it('never shows another merchant’s records', async () => {
    const w = await world();
    const other = await world();
    await record(w, 'shared-name', { metadata: { team: 'a' } });
    await record(other, 'shared-name', { metadata: { team: 'a' } });
    const mine = (await list(w, filters([['team', 'a']]))).json() as Page;
    expect(mine.data).toHaveLength(1);
    expect(mine.data[0]!.customer_id).toBe(w.customers[0]);
    expect(await listIds(w, `customer_id=${other.customers[0]}`)).toEqual([]);
  });
});
