import fc from 'fast-check';
import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, MAX_AMOUNT_UNITS, MAX_WALLET_BALANCE_UNITS, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import type { Storage } from '../../src/storage/db.ts';
import { carryOf } from '../../src/storage/exact-sum.ts';
import { CARRIED_SUMS } from '../../src/storage/rollups.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { useTestApp, type TestApp } from '../helpers/app.ts';
import { printFigures } from './harness.ts';

/**
 * Money at its bounds, on both engines: grants of the largest amount the API accepts, repeated
 * past the maximum wallet balance, are refused with a 4xx and leave the balance exact; random
 * grants and charges up to the bounds keep every balance exact and the ledger consistent; and
 * SQLite never ends up holding money as a float (a BIGINT that overflows there turns into REAL).
 */

const LARGEST_GRANT = formatMoney(MAX_AMOUNT_UNITS - 1n);
/** A meter charging the largest rate per million tokens: `tokens` tokens cost tokens × 100, exactly. */
let meters = 0;
const costlyMeter = () => ({ name: `Costly ${meters++}`, rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: formatMoney(MAX_AMOUNT_UNITS) }] });
const UNITS_PER_TOKEN = MAX_AMOUNT_UNITS / 1_000_000n;

/** Every stored value of an integer-declared column (money, counts) that SQLite holds as anything but an integer. */
async function nonIntegerValues(storage: Storage): Promise<string[]> {
  const tables = await sql<{ name: string }>`select name from sqlite_master where type = 'table' and name not like 'sqlite_%'`.execute(storage.db);
  const found: string[] = [];
  for (const { name: table } of tables.rows) {
    const columns = await sql<{ name: string; type: string }>`select name, type from pragma_table_info(${table})`.execute(storage.db);
    for (const column of columns.rows.filter((c) => /int/i.test(c.type))) {
      const bad = await sql<{ n: number }>`select count(*) as n from ${sql.table(table)} where typeof(${sql.ref(column.name)}) not in ('integer', 'null')`.execute(
        storage.db,
      );
      if (Number(bad.rows[0]!.n) > 0) found.push(`${table}.${column.name}: ${bad.rows[0]!.n} rows`);
    }
  }
  return found;
}

async function integerColumnsOf(storage: Storage, table: string): Promise<string[]> {
  const columns = await sql<{ name: string; type: string }>`select name, type from pragma_table_info(${table})`.execute(storage.db);
  return columns.rows.filter((c) => /int/i.test(c.type)).map((c) => c.name);
}

async function integerColumnCount(storage: Storage): Promise<number> {
  const counted = await sql<{ n: number }>`
    select count(*) as n from sqlite_master m join pragma_table_info(m.name) c
    where m.type = 'table' and c.type like '%int%'`.execute(storage.db);
  return Number(counted.rows[0]!.n);
}

type Api = { grant(customerId: string, amount: string): Promise<Response>; charge(customerId: string, slug: string, tokens: number): Promise<Response> };

let sequence = 0;

function apiOf(t: TestApp, base: string): Api {
  const post = (path: string, body: unknown) =>
    fetch(`${base}${path}`, { method: 'POST', headers: { ...t.auth(), 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return {
    grant: (customerId, amount) => post(`/v1/customers/${customerId}/credits`, { amount }),
    charge: (customerId, slug, tokens) => post('/v1/requests', { request_id: `bounds-${sequence++}`, customer_id: customerId, meter_slug: slug, input_tokens: tokens }),
  };
}

type UsageTotals = { total_requests: number; total_wallet_cost: string; total_request_cost: string };

/** GET /v1/usage's totals for the test clock's UTC day, of one customer or of the whole merchant. */
async function usageToday(base: string, t: TestApp, customerId?: string): Promise<UsageTotals> {
  const query = new URLSearchParams({ start: new Date(t.clock.now()).toISOString().slice(0, 10), ...(customerId ? { customer_id: customerId } : {}) });
  const res = await fetch(`${base}/v1/usage?${query}`, { headers: t.auth() });
  expect(res.status).toBe(200);
  return ((await res.json()) as { totals: UsageTotals }).totals;
}

async function balanceOf(base: string, t: TestApp, customerId: string): Promise<bigint> {
  const res = await fetch(`${base}/v1/customers/${customerId}`, { headers: t.auth() });
  expect(res.status).toBe(200);
  return parseMoney(((await res.json()) as { wallet: { balance: string } }).wallet.balance);
}

describe.each(databasesUnderTest())('money at its bounds (%s)', (dialect) => {
  const t = useTestApp(dialect, { env: { RATE_LIMIT_PER_MINUTE: '100000000' } });
  let base: string;
  beforeAll(async () => {
    base = await t.listen();
  });

  it('refuses grants past the maximum wallet balance with wallet_balance_limit, keeping the balance exact and the ledger clean', async () => {
    const api = apiOf(t, base);
    const customer = await t.customerWithMeter({ meter: costlyMeter() });
    const statuses: number[] = [];
    for (let i = 0; i < 95; i++) {
      const res = await api.grant(customer.customerId, LARGEST_GRANT);
      statuses.push(res.status);
      const body = (await res.json()) as { error?: { code: string } };
      if (i > 0) expect(body.error?.code).toBe('wallet_balance_limit');
    }
    expect(statuses[0]).toBe(201);
    expect(statuses.slice(1).every((s) => s === 422)).toBe(true);
    expect(await balanceOf(base, t, customer.customerId)).toBe(MAX_AMOUNT_UNITS - 1n);

    // Topping up to exactly the maximum is allowed; one unit more is not.
    expect((await api.grant(customer.customerId, formatMoney(1n))).status).toBe(201);
    expect((await api.grant(customer.customerId, formatMoney(1n))).status).toBe(422);
    expect(await balanceOf(base, t, customer.customerId)).toBe(MAX_WALLET_BALANCE_UNITS);

    // The wallet still pays: the whole of it, in one record.
    const charged = await api.charge(customer.customerId, customer.meterSlug, 1_000_000);
    expect(charged.status).toBe(201);
    expect(await balanceOf(base, t, customer.customerId)).toBe(0n);

    // The refusal is documented on the operation.
    const doc = (await (await fetch(`${base}/v1/openapi.json`)).json()) as { paths: Record<string, Record<string, { responses: Record<string, unknown> }>> };
    expect(JSON.stringify(doc.paths['/v1/customers/{id}/credits']!.post!.responses['422'])).toContain('wallet_balance_limit');

    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    if (dialect === 'sqlite') expect(await nonIntegerValues(t.storage)).toEqual([]);
  });

  it('keeps balances exact under random grants and charges up to the bounds', async () => {
    const api = apiOf(t, base);
    const near = (max: bigint) => fc.oneof(fc.bigInt({ min: 1n, max }), fc.bigInt({ min: max - 1_000_000n, max }), fc.constant(max));
    const operation = fc.oneof(
      near(MAX_AMOUNT_UNITS).map((units) => ({ kind: 'grant' as const, units })),
      fc.oneof(fc.integer({ min: 0, max: 1_000 }), fc.integer({ min: 0, max: 1_000_000 }), fc.constantFrom(999_999, 1_000_000)).map((tokens) => ({ kind: 'charge' as const, tokens })),
    );
    const figures = { runs: 0, grants_201: 0, grants_422: 0, charges_201: 0, charges_402: 0, rollup_total_past_bigint: 0 };
    // Every run in the same quarter-hour (the test clock stands still): the merchant's rollup rows
    // of that quarter-hour sum many times what one BIGINT holds, and must stay exact.
    const before = await usageToday(base, t);
    let charged = 0n;
    await fc.assert(
      fc.asyncProperty(fc.array(operation, { minLength: 1, maxLength: 25 }), async (operations) => {
        figures.runs++;
        const customer = await t.customerWithMeter({ meter: costlyMeter() });
        let expected = 0n;
        let customerCharged = 0n;
        for (const op of operations) {
          if (op.kind === 'grant') {
            const res = await api.grant(customer.customerId, formatMoney(op.units));
            const fits = expected + op.units <= MAX_WALLET_BALANCE_UNITS;
            expect(res.status).toBe(fits ? 201 : 422);
            const body = (await res.json()) as { balance?: string };
            if (fits) {
              expected += op.units;
              expect(parseMoney(body.balance!)).toBe(expected);
              figures.grants_201++;
            } else figures.grants_422++;
          } else {
            const cost = BigInt(op.tokens) * UNITS_PER_TOKEN;
            const res = await api.charge(customer.customerId, customer.meterSlug, op.tokens);
            expect(res.status).toBe(cost <= expected ? 201 : 402);
            const body = (await res.json()) as { total_wallet_cost?: string };
            if (res.status === 201) {
              expect(parseMoney(body.total_wallet_cost!)).toBe(cost);
              expected -= cost;
              customerCharged += cost;
              charged += cost;
              figures.charges_201++;
            } else figures.charges_402++;
          }
        }
        expect(await balanceOf(base, t, customer.customerId)).toBe(expected);
        // A customer may be charged more than a wallet holds, refilled between charges.
        expect(parseMoney((await usageToday(base, t, customer.customerId)).total_wallet_cost)).toBe(customerCharged);
      }),
      { numRuns: 40 },
    );
    const after = await usageToday(base, t);
    expect(after.total_requests - before.total_requests).toBe(figures.charges_201);
    expect(parseMoney(after.total_wallet_cost) - parseMoney(before.total_wallet_cost)).toBe(charged);
    expect(parseMoney(after.total_request_cost) - parseMoney(before.total_request_cost)).toBe(charged);
    figures.rollup_total_past_bigint = parseMoney(after.total_wallet_cost) > 2n ** 63n - 1n ? 1 : 0;
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    if (dialect === 'sqlite') {
      expect(await integerColumnCount(t.storage)).toBeGreaterThan(40);
      // The check covers the rollups' sums and their carries.
      const checked = await integerColumnsOf(t.storage, 'usage_rollups_grouped');
      expect(checked).toEqual(expect.arrayContaining([...CARRIED_SUMS, ...CARRIED_SUMS.map(carryOf)]));
      expect(await nonIntegerValues(t.storage)).toEqual([]);
    }
    printFigures(`money bounds (${dialect})`, figures);
  });
});
