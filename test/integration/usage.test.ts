import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { chargeRequest } from '../../src/ledger/charge.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { RequestRecord } from '../../src/services/requests.ts';
import { findConnection } from '../../src/storage/connections.ts';
import { findMerchant } from '../../src/storage/merchants.ts';
import { findMeterBySlug } from '../../src/storage/meters.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Totals = {
  total_requests: number;
  total_usage_tokens: number;
  total_usage_cost: string;
  total_fee_amount: string;
  total_service_charge_amount: string;
  total_request_cost: string;
  total_wallet_cost: string;
  total_merchant_cost: string;
  total_cost: string;
  total_charge: string;
};
type Item = Totals & { date: string; start: string; end: string };
type Usage = { items: Item[]; totals: Totals };

type World = {
  merchant: Merchant;
  customers: [string, string];
  meters: { tokens: { id: string; slug: string }; calls: { id: string; slug: string } };
};

const MINUTE = 60_000;
const METADATA: Record<string, string>[] = [{ team: 'a', env: 'prod' }, { team: 'a', env: 'dev' }, { team: 'b', env: 'prod' }, {}];

/**
 * Records placed on both sides of the local midnights of -05:00, +05:30, +05:45, -02:45 (any
 * quarter hour is accepted) and UTC around a month boundary, plus a few outside the reported
 * range. Customers, meters, metadata and sizes vary.
 */
const SEED_TIMES = [
  '2026-02-20T12:00:00.000Z',
  '2026-02-26T04:59:59.999Z',
  '2026-02-26T05:00:00.000Z',
  '2026-02-28T04:59:59.999Z',
  '2026-02-28T05:00:00.000Z',
  '2026-02-28T18:14:59.999Z',
  '2026-02-28T18:15:00.000Z',
  '2026-02-28T18:29:59.999Z',
  '2026-02-28T18:30:00.000Z',
  '2026-02-28T23:59:59.999Z',
  '2026-03-01T00:00:00.000Z',
  '2026-03-01T02:44:59.999Z',
  '2026-03-01T02:45:00.000Z',
  '2026-03-01T04:59:59.999Z',
  '2026-03-01T05:00:00.000Z',
  '2026-03-01T18:29:59.999Z',
  '2026-03-02T12:00:00.000Z',
  '2026-03-02T12:07:00.000Z',
  '2026-03-04T18:30:00.000Z',
  '2026-03-05T04:59:59.999Z',
  '2026-03-05T05:00:00.000Z',
  '2026-03-08T04:30:00.000Z',
  '2026-03-08T06:30:00.000Z',
  '2026-03-10T12:00:00.000Z',
];

/** The day sums, recounted here from the records themselves (as GET /requests lists them). */
function recount(records: RequestRecord[], offsetMinutes: number, first: string, last: string, match: (r: RequestRecord) => boolean): Usage {
  const dates = datesBetween(first, last);
  const sums = new Map(dates.map((d) => [d, zeroSums()]));
  for (const r of records.filter(match)) {
    const local = new Date(Date.parse(r.created_at) + offsetMinutes * MINUTE).toISOString().slice(0, 10);
    const s = sums.get(local);
    if (s) addRecord(s, r);
  }
  const total = zeroSums();
  const items = dates.map((date) => {
    const s = sums.get(date)!;
    for (const k of Object.keys(total) as (keyof Sums)[]) total[k] += s[k];
    const startMs = Date.parse(`${date}T00:00:00.000Z`) - offsetMinutes * MINUTE;
    return {
      date,
      start: new Date(startMs).toISOString(),
      end: new Date(startMs + 24 * 60 * MINUTE).toISOString(),
      ...present(s),
    };
  });
  return { items, totals: present(total) };
}

type Sums = { requests: bigint; tokens: bigint; usage: bigint; fee: bigint; service: bigint; request: bigint; wallet: bigint; merchant: bigint };
const zeroSums = (): Sums => ({ requests: 0n, tokens: 0n, usage: 0n, fee: 0n, service: 0n, request: 0n, wallet: 0n, merchant: 0n });

function addRecord(s: Sums, r: RequestRecord): void {
  s.requests += 1n;
  s.tokens += BigInt(r.model_usage.total_tokens);
  s.usage += parseMoney(r.model_usage.total_cost);
  s.fee += parseMoney(r.fee.amount);
  s.service += parseMoney(r.service_charge.amount);
  s.request += parseMoney(r.total_request_cost);
  s.wallet += parseMoney(r.total_wallet_cost);
  s.merchant += parseMoney(r.total_merchant_cost);
}

function present(s: Sums): Totals {
  return {
    total_requests: Number(s.requests),
    total_usage_tokens: Number(s.tokens),
    total_usage_cost: formatMoney(s.usage),
    total_fee_amount: formatMoney(s.fee),
    total_service_charge_amount: formatMoney(s.service),
    total_request_cost: formatMoney(s.request),
    total_wallet_cost: formatMoney(s.wallet),
    total_merchant_cost: formatMoney(s.merchant),
    total_cost: formatMoney(s.usage),
    total_charge: formatMoney(s.fee),
  };
}

function datesBetween(first: string, last: string): string[] {
  const dates: string[] = [];
  for (let ms = Date.parse(`${first}T00:00:00Z`); ms <= Date.parse(`${last}T00:00:00Z`); ms += 24 * 60 * MINUTE) {
    dates.push(new Date(ms).toISOString().slice(0, 10));
  }
  return dates;
}

const hasPairs = (pairs: [string, string][]) => (r: RequestRecord) => pairs.every(([k, v]) => r.metadata[k] === v);
const filters = (pairs: [string, string][]) => `metadata_filters=${encodeURIComponent(JSON.stringify(pairs))}`;

describe.each(databasesUnderTest())('GET /v1/usage on %s', (dialect) => {
  let t: TestApp;
  let w: World;
  /** Every record of `w`, read back through GET /v1/requests. */
  let records: RequestRecord[];

  const get = (m: Merchant, query: string) =>
    t.app.inject({ method: 'GET', url: `/v1/usage?${query}`, headers: t.auth(m.secretKey) });

  async function usage(m: Merchant, query: string): Promise<Usage> {
    const res = await get(m, query);
    expect(res.statusCode, res.body).toBe(200);
    return res.json();
  }

  async function world(): Promise<World> {
    const merchant = await t.newMerchant();
    const post = async (url: string, payload: object) =>
      (await t.app.inject({ method: 'POST', url, headers: t.auth(merchant.secretKey), payload })).json();
    const customer = async () => {
      const c = await post('/v1/customers', {});
      await creditWallet(t.storage, c.wallet.wallet_id, parseMoney('1000'), new Date().toISOString());
      return c.customer_id as string;
    };
    await creditWallet(t.storage, merchant.walletId, parseMoney('1000'), new Date().toISOString());
    // Tokens: the merchant pays base cost and service charge; calls: the wallet pays everything.
    const tokens = await post('/v1/meters', {
      name: 'Tokens',
      rate_type: 'fixed',
      tier_type: 'tokens_1m',
      base_cost_payer: 'merchant',
      service_charge_payer: 'merchant',
      tiers: [{ start: '0', rate: '3' }],
    });
    const calls = await post('/v1/meters', { name: 'Calls', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: '0', rate: '0.25' }] });
    return {
      merchant,
      customers: [await customer(), await customer()],
      meters: { tokens: { id: tokens.meter_id, slug: tokens.meter_slug }, calls: { id: calls.meter_id, slug: calls.meter_slug } },
    };
  }

  /** Records one request as if it had happened at `at`: chargeRequest's clock is the record's. */
  async function recordAt(w: World, i: number, at: string): Promise<void> {
    const merchant = (await findMerchant(t.storage, w.merchant.merchantId))!;
    const connection = (await findConnection(t.storage, merchant.id, w.customers[i % 2]!))!;
    const meter = (await findMeterBySlug(t.storage, merchant.id, Math.floor(i / 2) % 2 ? w.meters.calls.slug : w.meters.tokens.slug))!;
    const result = await chargeRequest(t.storage, {
      merchant,
      connection,
      meter,
      requestId: `seed-${i}`,
      bodyHash: null,
      usage: { inputTokens: 1000 * (i + 1), outputTokens: 500 * (i + 1), inputCharacters: 0, outputCharacters: 0, inputSeconds: '0', outputSeconds: '0' },
      provider: 'openai',
      model: 'test-model',
      endpoint: 'POST /v1/requests',
      providerKeyType: 'managed',
      basePrices: { input: parseMoney('2'), output: parseMoney('8') },
      serviceChargeRate: parseMoney('10'),
      metadata: METADATA[i % METADATA.length]!,
      now: new Date(at),
    });
    expect(result.outcome).toBe('recorded');
  }

  async function allRecords(m: Merchant): Promise<RequestRecord[]> {
    const all: RequestRecord[] = [];
    let cursor: string | null = null;
    do {
      const query: string = cursor ? `limit=100&cursor=${encodeURIComponent(cursor)}` : 'limit=100';
      const page = (await t.app.inject({ method: 'GET', url: `/v1/requests?${query}`, headers: t.auth(m.secretKey) })).json();
      all.push(...page.data);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  }

  beforeAll(async () => {
    t = await startTestApp(dialect);
    w = await world();
    for (const [i, at] of SEED_TIMES.entries()) await recordAt(w, i, at);
    records = await allRecords(w.merchant);
  });
  afterAll(async () => t?.close());

  it('seeds records carrying every kind of amount, at the times chosen', () => {
    expect(records.map((r) => r.created_at).sort()).toEqual(SEED_TIMES);
    const sum = (f: (r: RequestRecord) => string) => records.reduce((s, r) => s + parseMoney(f(r)), 0n);
    for (const f of [
      (r: RequestRecord) => r.model_usage.total_cost,
      (r: RequestRecord) => r.fee.amount,
      (r: RequestRecord) => r.service_charge.amount,
      (r: RequestRecord) => r.total_wallet_cost,
      (r: RequestRecord) => r.total_merchant_cost,
    ]) {
      expect(sum(f)).toBeGreaterThan(0n);
    }
  });

  const cases: [string, string, (w: World) => string, (w: World) => (r: RequestRecord) => boolean][] = [
    ['no filter (rollups)', '', () => '', () => () => true],
    ['customer_id (rollups)', '', (w) => `customer_id=${w.customers[1]}`, (w) => (r) => r.customer_id === w.customers[1]],
    ['product_id (rollups)', '', (w) => `product_id=${w.meters.tokens.id}`, (w) => (r) => r.meter_id === w.meters.tokens.id],
    ['one metadata pair (metadata rollups)', '', () => filters([['team', 'a']]), () => hasPairs([['team', 'a']])],
    ['two metadata pairs (records)', '', () => filters([['team', 'a'], ['env', 'prod']]), () => hasPairs([['team', 'a'], ['env', 'prod']])],
    [
      'connection_id and a metadata pair (metadata rollups)',
      '',
      (w) => `connection_id=${w.customers[0]}&${filters([['env', 'prod']])}`,
      (w) => (r) => r.customer_id === w.customers[0] && hasPairs([['env', 'prod']])(r),
    ],
    [
      'meter_id and a metadata pair (metadata rollups)',
      '',
      (w) => `meter_id=${w.meters.calls.id}&${filters([['team', 'b']])}`,
      (w) => (r) => r.meter_id === w.meters.calls.id && hasPairs([['team', 'b']])(r),
    ],
  ];
  const offsets: [string, number][] = [
    ['-05:00', -300],
    ['+05:30', 330],
    ['+05:45', 345],
    ['-02:45', -165],
  ];

  describe.each(offsets)('with start at offset %s', (offset, minutes) => {
    it.each(cases)('matches a recount of the records across the month boundary: %s', async (_name, _x, query, match) => {
      const start = encodeURIComponent(`2026-02-26T00:00:00${offset}`);
      const got = await usage(w.merchant, [`start=${start}&end=2026-03-04`, query(w)].filter(Boolean).join('&'));
      expect(got).toEqual(recount(records, minutes, '2026-02-26', '2026-03-04', match(w)));
    });
  });

  it('cuts the days at the offset’s local midnight (spot checks)', async () => {
    const west = await usage(w.merchant, `start=${encodeURIComponent('2026-02-26T00:00:00-05:00')}&end=2026-03-04`);
    expect(west.items.map((i) => [i.date, i.total_requests])).toEqual([
      ['2026-02-26', 1],
      ['2026-02-27', 1],
      ['2026-02-28', 10],
      ['2026-03-01', 2],
      ['2026-03-02', 2],
      ['2026-03-03', 0],
      ['2026-03-04', 2],
    ]);
    expect(west.items[0]).toMatchObject({ start: '2026-02-26T05:00:00.000Z', end: '2026-02-27T05:00:00.000Z' });
    const east = await usage(w.merchant, `start=${encodeURIComponent('2026-02-26T00:00:00+05:30')}&end=2026-03-04`);
    expect(east.items.map((i) => [i.date, i.total_requests])).toEqual([
      ['2026-02-26', 2],
      ['2026-02-27', 0],
      ['2026-02-28', 5],
      ['2026-03-01', 8],
      ['2026-03-02', 2],
      ['2026-03-03', 0],
      ['2026-03-04', 0],
    ]);
    expect(east.items[0]).toMatchObject({ start: '2026-02-25T18:30:00.000Z', end: '2026-02-26T18:30:00.000Z' });
  });

  it('accepts +05:30 sent unencoded in the query string (its + arrives as a space)', async () => {
    const raw = await usage(w.merchant, 'start=2026-02-26T00:00:00+05:30&end=2026-03-04');
    expect(raw).toEqual(await usage(w.merchant, `start=${encodeURIComponent('2026-02-26T00:00:00+05:30')}&end=2026-03-04`));
  });

  it('reads a plain-date start as UTC days', async () => {
    const got = await usage(w.merchant, 'start=2026-02-28&end=2026-03-01');
    expect(got).toEqual(recount(records, 0, '2026-02-28', '2026-03-01', () => true));
    expect(got.items.map((i) => [i.start, i.total_requests])).toEqual([
      ['2026-02-28T00:00:00.000Z', 7],
      ['2026-03-01T00:00:00.000Z', 6],
    ]);
    // The same days written as date-times at Z.
    expect(await usage(w.merchant, 'start=2026-02-28T00:00:00Z&end=2026-03-01T23:59:59Z')).toEqual(got);
  });

  it('keeps start’s offset for every day, even when end is written in another offset (a daylight-saving change)', async () => {
    // 2026-03-08 is a US daylight-saving change (-05:00 → -04:00); only the offset given counts.
    const start = encodeURIComponent('2026-03-07T00:00:00-05:00');
    const got = await usage(w.merchant, `start=${start}&end=${encodeURIComponent('2026-03-09T00:00:00-04:00')}`);
    expect(got).toEqual(recount(records, -300, '2026-03-07', '2026-03-08', () => true));
    expect(got.items.map((i) => [i.date, i.start, i.total_requests])).toEqual([
      ['2026-03-07', '2026-03-07T05:00:00.000Z', 1], // 2026-03-08T04:30Z is still the 7th at -05:00
      ['2026-03-08', '2026-03-08T05:00:00.000Z', 1],
    ]);
    expect(await usage(w.merchant, `start=${start}&end=2026-03-08`)).toEqual(got);
  });

  it('returns zero-filled days, with both vocabularies, where nothing happened', async () => {
    const got = await usage(w.merchant, 'start=2026-01-01&end=2026-01-03');
    const zero = {
      total_requests: 0,
      total_usage_tokens: 0,
      total_usage_cost: '0.0000000000',
      total_fee_amount: '0.0000000000',
      total_service_charge_amount: '0.0000000000',
      total_request_cost: '0.0000000000',
      total_wallet_cost: '0.0000000000',
      total_merchant_cost: '0.0000000000',
      total_cost: '0.0000000000',
      total_charge: '0.0000000000',
    };
    expect(got).toEqual({
      items: ['2026-01-01', '2026-01-02', '2026-01-03'].map((date) => ({
        date,
        start: `${date}T00:00:00.000Z`,
        end: new Date(Date.parse(`${date}T00:00:00Z`) + 86_400_000).toISOString(),
        ...zero,
      })),
      totals: zero,
    });
  });

  it('has totals equal to the sum of its items, and total_cost/total_charge equal to the older names', async () => {
    for (const query of ['', `&${filters([['team', 'a']])}`]) {
      const got = await usage(w.merchant, `start=${encodeURIComponent('2026-02-15T00:00:00+05:30')}&end=2026-03-15${query}`);
      expect(got.items).toHaveLength(29);
      for (const item of [...got.items, got.totals]) {
        expect(item.total_cost).toBe(item.total_usage_cost);
        expect(item.total_charge).toBe(item.total_fee_amount);
        expect(item.total_request_cost).toBe(formatMoney(parseMoney(item.total_wallet_cost) + parseMoney(item.total_merchant_cost)));
      }
      const money = ['total_usage_cost', 'total_fee_amount', 'total_service_charge_amount', 'total_request_cost', 'total_wallet_cost', 'total_merchant_cost', 'total_cost', 'total_charge'] as const;
      for (const k of money) {
        expect(got.totals[k]).toBe(formatMoney(got.items.reduce((s, i) => s + parseMoney(i[k]), 0n)));
        expect(got.totals[k]).toMatch(/^\d+\.\d{10}$/);
      }
      expect(got.totals.total_requests).toBe(got.items.reduce((s, i) => s + i.total_requests, 0));
      expect(got.totals.total_usage_tokens).toBe(got.items.reduce((s, i) => s + i.total_usage_tokens, 0));
      expect(got.totals.total_requests).toBeGreaterThan(0);
    }
  });

  it('runs to today when end is absent, counting requests recorded just now', async () => {
    const m = await world();
    const post = (request_id: string) =>
      t.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers: t.auth(m.merchant.secretKey),
        payload: { request_id, customer_id: m.customers[0], meter_slug: m.meters.calls.slug, metadata: { team: 'now' } },
      });
    const before = new Date().toISOString().slice(0, 10);
    expect((await post('now-1')).statusCode).toBe(201);
    expect((await post('now-2')).statusCode).toBe(201);
    const twoDaysAgo = new Date(Date.now() - 2 * 86_400_000).toISOString().slice(0, 10);
    for (const query of [`start=${twoDaysAgo}`, `start=${twoDaysAgo}&${filters([['team', 'now']])}`]) {
      const got = await usage(m.merchant, query);
      const after = new Date().toISOString().slice(0, 10);
      expect([before, after]).toContain(got.items[got.items.length - 1]!.date);
      expect(got.items.length).toBeGreaterThanOrEqual(3);
      expect(got.totals).toMatchObject({ total_requests: 2, total_fee_amount: '0.5000000000', total_charge: '0.5000000000' });
    }
  });

  it('never counts another merchant’s usage', async () => {
    const other = await world();
    for (const query of ['start=2026-02-01&end=2026-03-31', `start=2026-02-01&end=2026-03-31&${filters([['team', 'a']])}`]) {
      expect((await usage(other.merchant, query)).totals.total_requests).toBe(0);
    }
    const own = await usage(w.merchant, `start=2026-02-01&end=2026-03-31&customer_id=${other.customers[0]}`);
    expect(own.totals.total_requests).toBe(0);
  });

  it.each([
    ['no start', 'end=2026-03-01', 'validation_error', ['start']],
    ['start not a date', 'start=yesterday', 'validation_error', ['start']],
    ['start without an offset', 'start=2026-03-01T00:00:00', 'validation_error', ['start']],
    ['an impossible date', 'start=2026-02-30', 'validation_error', ['start']],
    ['an offset that is not a quarter hour', `start=${encodeURIComponent('2026-03-01T00:00:00+05:20')}`, 'validation_error', ['start']],
    ['an offset beyond 14 hours', `start=${encodeURIComponent('2026-03-01T00:00:00+15:00')}`, 'validation_error', ['start']],
    ['a bad end', 'start=2026-03-01&end=soon', 'validation_error', ['end']],
    ['end before start', 'start=2026-03-02&end=2026-03-01', 'validation_error', ['end']],
    ['start in the future', 'start=2999-01-01', 'validation_error', ['start']],
    ['more than 366 days', 'start=2025-01-01&end=2026-01-02', 'validation_error', ['end']],
    ['metadata_filters not JSON', 'start=2026-03-01&end=2026-03-02&metadata_filters=team', 'invalid_metadata', ['metadata_filters']],
    ['metadata_filters not pairs', `start=2026-03-01&end=2026-03-02&metadata_filters=${encodeURIComponent('{"team":"a"}')}`, 'invalid_metadata', ['metadata_filters']],
    ['a metadata key with a hyphen', `start=2026-03-01&end=2026-03-02&${filters([['cost-center', 'x']])}`, 'invalid_metadata', ['metadata_filters', '0', '0']],
    ['customer_id and connection_id differing', 'start=2026-03-01&end=2026-03-02&customer_id=a&connection_id=b', 'validation_error', ['customer_id']],
    ['meter_id and product_id differing', 'start=2026-03-01&end=2026-03-02&meter_id=a&product_id=b', 'validation_error', ['meter_id']],
  ])('refuses %s with 400', async (_name, query, code, path) => {
    const res = await get(w.merchant, query);
    expect(res.statusCode).toBe(400);
    const error = res.json().error;
    expect(error).toMatchObject({ code, status: 400 });
    expect(error.issues.map((i: { path: string[] }) => i.path)).toContainEqual(path);
  });

  it('answers the published client (11.2): usage.retrieve and requests.list with metadata_filters', async () => {
    const base = await t.listen();
    const lava = new Lava(w.merchant.secretKey, { baseUrl: `${base}/v1/` });
    const got = await lava.usage.retrieve({
      start: '2026-02-26T00:00:00+05:30',
      end: '2026-03-04',
      customer_id: w.customers[0],
      metadata_filters: { team: 'a' },
    });
    const match = (r: RequestRecord) => r.customer_id === w.customers[0] && r.metadata.team === 'a';
    expect(got).toEqual(recount(records, 330, '2026-02-26', '2026-03-04', match));
    const listed = await lava.requests.list({ metadata_filters: { team: 'a', env: 'prod' }, limit: 100 });
    expect(listed.data.map((r) => r.request_id)).toEqual(records.filter(hasPairs([['team', 'a'], ['env', 'prod']])).map((r) => r.request_id));
  });
});
