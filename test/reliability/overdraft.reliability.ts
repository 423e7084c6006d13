import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { freshDatabase } from '../helpers/databases.ts';
import type { MockGateway } from '../helpers/gateway.ts';
import { printFigures, startSuiteGateway } from './harness.ts';
import { forwardToken } from '../helpers/app.ts';
import type { Storage } from '../../src/storage/db.ts';

/**
 * Overdraft bound (decision 0019) against a provider that reports 40 times the usage it served:
 * clients forward calls billed to customers through two instances sharing one PostgreSQL, each
 * client sticking to one customer, until every wallet refuses. Every wallet ends no lower than
 * −(F − 1) × the holds in flight on it (F = 40): once a settled charge exceeds its hold, the wallet
 * admits nothing more while requests are in flight on it.
 *
 * "In flight" is admitted and not yet settled, which is not the same as a client waiting: a
 * request is settled after its answer has gone out, so a client's next request can be admitted
 * while its last is still held. The holds in flight are therefore read from the database, from a
 * log of every change to the rows (a trigger), not assumed from the number of clients.
 */

const postgres = process.env.TEST_DATABASE_URL;
const FACTOR = 40;
const CUSTOMERS = 4;
const CLIENTS_PER_CUSTOMER = 4;
const CALLS_PER_CLIENT = 25;
const GRANT = '0.05';
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const body = { model: 'gpt-4o-mini', max_tokens: 50, messages: [{ role: 'user', content: 'how far below zero can this go' }] };

/**
 * Two instances on one fresh PostgreSQL database, each with its own mock upstream reporting FACTOR
 * times the usage it served; filled before the suite's tests run and closed after them.
 */
function overReportingPair(): MockGateway[] {
  const instances: MockGateway[] = [];
  beforeAll(async () => {
    const database = await freshDatabase('postgres');
    instances.push(await startSuiteGateway('postgres', { database }), await startSuiteGateway('postgres', { database }));
    for (const gw of instances) gw.upstream.setNext({ path: '/chat/completions', overReport: FACTOR, times: Infinity });
  });
  afterAll(async () => {
    for (const gw of instances) {
      await gw.t.close();
      await gw.upstream.close();
    }
  });
  return instances;
}

type RowLog = 'wallets' | 'spend_keys';
const LOGGED_COLUMNS: Record<RowLog, string[]> = {
  wallets: ['balance', 'held'],
  spend_keys: ['total_requests', 'current_spend', 'reserved_spend'],
};

/**
 * Logs every update of a table's rows into `<table>_log`, in the order the updates took the row's
 * lock (the sequence is drawn while the lock is held, and the next writer waits for the commit).
 */
async function logRowUpdates(storage: Storage, table: RowLog): Promise<void> {
  const columns = LOGGED_COLUMNS[table];
  const log = `${table}_log`;
  await sql
    .raw(
      `create table ${log} (seq bigserial primary key, id text not null, ${columns.map((c) => `${c} bigint not null`).join(', ')});
       create function ${log}_append() returns trigger language plpgsql as $$
       begin
         insert into ${log} (id, ${columns.join(', ')}) values (new.id, ${columns.map((c) => `new.${c}`).join(', ')});
         return new;
       end $$;
       create trigger ${log}_append after update on ${table} for each row execute function ${log}_append();`,
    )
    .execute(storage.db);
}

/** The logged states of one row, oldest first. */
async function rowHistory(storage: Storage, table: RowLog, id: string): Promise<Record<string, bigint>[]> {
  const { rows } = await sql<Record<string, string>>`
    select ${sql.raw(LOGGED_COLUMNS[table].join(', '))} from ${sql.table(`${table}_log`)} where id = ${id} order by seq`.execute(storage.db);
  return rows.map((row) => Object.fromEntries(Object.entries(row).map(([column, value]) => [column, BigInt(value)])));
}

describe.runIf(postgres)('overdraft bound against a provider over-reporting 40 times, two instances on postgres', () => {
  const instances = overReportingPair();

  it('keeps every wallet above −(F − 1) × the most it held at once', async () => {
    const [a] = instances;
    const { t } = a!;
    await logRowUpdates(t.storage, 'wallets');
    const secretKey = t.merchant.secretKey;
    const customers: { customerId: string; walletId: string; token: string; hold: bigint }[] = [];
    for (let i = 0; i < CUSTOMERS; i++) {
      const c = await t.customerWithMeter({ credit: GRANT, meter: { name: `o${i}`, rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '1' }] } });
      const token = forwardToken(secretKey, c.customerId, c.meterSlug);
      const billing = await resolveForwardCredential(t.storage, token, new Date());
      const estimate = estimateHold({
        requestBody: body,
        pricing: pricingFor(billing).pricing,
        prices: lookupBasePrices('openai', body.model, { overrides: t.config.priceOverrides }),
        baseCostCharged: true,
        serviceChargeRate: billing.serviceChargeRate ?? t.config.serviceChargeRate,
        defaultOutputCap: t.config.defaultMaxOutputTokens,
      });
      customers.push({ ...c, token, hold: estimate.wallet });
    }
    const figures = { forwards_200: 0, refused_402: 0, other: 0 };
    let sequence = 0;
    const client = async (customer: { token: string }) => {
      for (let i = 0; i < CALLS_PER_CLIENT; i++) {
        const gw = instances[sequence++ % 2]!;
        const res = await fetch(`${gw.base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${customer.token}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        await res.arrayBuffer();
        if (res.status === 200) figures.forwards_200++;
        else if (res.status === 402) figures.refused_402++;
        else figures.other++;
      }
    };
    await Promise.all(customers.flatMap((customer) => Array.from({ length: CLIENTS_PER_CUSTOMER }, () => client(customer))));
    for (const gw of instances) await gw.t.app.close();

    const ledger = await verifyLedger(t.storage);
    const wallets = await t.storage.db.selectFrom('wallets').select(['id', 'balance', 'held']).where('id', 'in', customers.map((c) => c.walletId)).execute();
    const outcomes = await Promise.all(
      wallets.map(async (w) => {
        const history = await rowHistory(t.storage, 'wallets', w.id);
        const mostHeld = history.reduce((most, state) => (state.held! > most ? state.held! : most), 0n);
        return { walletId: w.id, balance: BigInt(w.balance), mostHeld, bound: -BigInt(FACTOR - 1) * mostHeld };
      }),
    );
    const beyond = outcomes.filter((o) => o.balance < o.bound);
    const lowest = outcomes.reduce((min, o) => (o.balance < min.balance ? o : min));
    const hold = customers[0]!.hold;
    const mostHeld = outcomes.reduce((most, o) => (o.mostHeld > most ? o.mostHeld : most), 0n);
    printFigures('overdraft (provider over-reporting 40x)', {
      requests: CUSTOMERS * CLIENTS_PER_CUSTOMER * CALLS_PER_CLIENT,
      ...figures,
      hold: formatMoney(hold),
      most_held: formatMoney(mostHeld),
      most_holds_at_once: Number(mostHeld / hold),
      lowest_wallet: formatMoney(lowest.balance),
      its_documented_bound: formatMoney(lowest.bound),
      wallets_beyond_bound: beyond.length,
      ledger_problems: ledger.problems.length,
      discrepancies: beyond.length + ledger.problems.length + figures.other,
    });
    expect(figures.forwards_200).toBeGreaterThan(0);
    expect(figures.refused_402, 'every wallet was driven until it refused').toBeGreaterThan(0);
    expect(figures.other).toBe(0);
    expect(lowest.balance, 'some wallet was overdrawn: the bound was exercised').toBeLessThan(0n);
    expect(beyond.map((c) => c.walletId)).toEqual([]);
    expect(wallets.every((w) => BigInt(w.held) === 0n)).toBe(true);
    expect(ledger.problems).toEqual([]);
  });
});

/**
 * The same provider against a spend key's limit (decision 0019): clients spend through one
 * merchant spend key on both instances until it refuses. The key's spend ends at most
 * L + (F − 1) × R (L its limit, R what was reserved on it, the admitted request's own reservation
 * included, at its last admission): a request is admitted only while spend + reservations + its
 * own reservation fit in L, so only what was in flight then can overrun, each by at most (F − 1)
 * times its reservation. R is read from the key's logged row, since requests in flight can
 * outnumber the clients (a request settles after its answer has gone out).
 */
const KEY_CLIENTS = 8;
const KEY_CALLS_PER_CLIENT = 25;
const KEY_LIMIT = '0.01';
const CHAT = '/v1/chat/completions';

describe.runIf(postgres)('spend-key limit against a provider over-reporting 40 times, two instances on postgres', () => {
  const instances = overReportingPair();

  it('admits only within L, and keeps the spend within L + (F − 1) × the reservations at the last admission', async () => {
    const { t } = instances[0]!;
    await logRowUpdates(t.storage, 'spend_keys');
    // The wallet has far more than the limit: the key's limit is what stops it.
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('100'), new Date().toISOString());
    const created = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'overdraft', spend_limit: { amount: KEY_LIMIT, cycle: 'total' } } });
    expect(created.statusCode).toBe(201);
    const key = created.json() as { key: string; spend_key_id: string };
    const startedAt = new Date(t.clock.now()).toISOString();

    const figures = { forwards_200: 0, refused_402: 0, other: 0 };
    let sequence = 0;
    const client = async () => {
      for (let i = 0; i < KEY_CALLS_PER_CLIENT; i++) {
        const gw = instances[sequence++ % 2]!;
        const res = await fetch(`${gw.base}${CHAT}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        await res.arrayBuffer();
        if (res.status === 200) figures.forwards_200++;
        else if (res.status === 402) figures.refused_402++;
        else figures.other++;
      }
    };
    await Promise.all(Array.from({ length: KEY_CLIENTS }, () => client()));
    for (const gw of instances) await gw.t.app.close();

    const row = await t.storage.db.selectFrom('spend_keys').selectAll().where('id', '=', key.spend_key_id).executeTakeFirstOrThrow();
    const records = await t.storage.db.selectFrom('requests').select(['id', 'status']).where('created_at', '>=', startedAt).execute();
    const holds = records.length
      ? await t.storage.db.selectFrom('holds').select(['reference', 'amount']).where('reference', 'in', records.map((r) => r.id)).execute()
      : [];
    const largestHold = holds.reduce((max, h) => (BigInt(h.amount) > max ? BigInt(h.amount) : max), 0n);
    const limit = parseMoney(KEY_LIMIT);
    const spend = BigInt(row.current_spend);
    const history = await rowHistory(t.storage, 'spend_keys', key.spend_key_id);
    const admissions = history.filter((state, i) => state.total_requests! > (history[i - 1]?.total_requests ?? 0n));
    const admittedBeyondLimit = admissions.filter((state) => state.current_spend! + state.reserved_spend! > limit);
    const reservedAtLast = admissions.at(-1)?.reserved_spend ?? 0n;
    const bound = limit + BigInt(FACTOR - 1) * reservedAtLast;
    const ledger = await verifyLedger(t.storage);
    const beyond = spend > bound ? 1 : 0;
    printFigures('overdraft spend key (provider over-reporting 40x)', {
      requests: KEY_CLIENTS * KEY_CALLS_PER_CLIENT,
      ...figures,
      largest_hold: formatMoney(largestHold),
      limit: KEY_LIMIT,
      admissions: admissions.length,
      admitted_beyond_limit: admittedBeyondLimit.length,
      reserved_at_last_admission: formatMoney(reservedAtLast),
      spend: formatMoney(spend),
      documented_bound: formatMoney(bound),
      keys_beyond_bound: beyond,
      ledger_problems: ledger.problems.length,
      discrepancies: beyond + admittedBeyondLimit.length + ledger.problems.length + figures.other,
    });
    expect(figures.forwards_200).toBeGreaterThan(0);
    expect(figures.refused_402, 'the key was driven until it refused').toBeGreaterThan(0);
    expect(figures.other).toBe(0);
    expect(records.filter((r) => r.status === 'completed')).toHaveLength(figures.forwards_200);
    expect(largestHold).toBeGreaterThan(0n);
    expect(admissions, 'every 200 was admitted once, by the logged row').toHaveLength(figures.forwards_200);
    expect(admittedBeyondLimit).toEqual([]);
    expect(spend, 'the limit was passed: the bound was exercised').toBeGreaterThan(limit);
    expect(spend).toBeLessThanOrEqual(bound);
    expect(BigInt(row.reserved_spend)).toBe(0n);
    expect(BigInt(row.total_spend)).toBe(spend);
    expect(ledger.problems).toEqual([]);
  });
});
