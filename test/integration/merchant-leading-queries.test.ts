import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { usageLeaders } from '../../src/services/usage-reports.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { OPENAI_CHAT, startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { CLUSTER_START_TIMEOUT_MS, startPostgresCluster, type PostgresCluster } from '../helpers/replica-cluster.ts';

/** The per-request and ledger tables: a shard by merchant would hold its rows of each. */
const PER_MERCHANT_TABLES = [
  'requests',
  'request_metadata',
  'usage_rollups',
  'usage_rollups_by_metadata',
  'usage_rollups_grouped',
  'usage_rollups_by_day',
  'meter_usage_counters',
  'ledger_transactions',
  'ledger_postings',
  'holds',
];

/**
 * Tables that do not carry merchant_id yet (decision 0041): their rows are found through a
 * transaction, wallet or meter of one merchant, so no statement on them can name it. Adding the
 * column takes a migration and every ledger write that fills it; this list then shrinks, and the
 * guard checks their statements too.
 */
const WITHOUT_MERCHANT_ID = ['holds', 'ledger_postings', 'meter_usage_counters'];

/**
 * Statements that span every merchant by design: maintenance that a sharded deployment runs on
 * each shard. Each is named by a piece of its text, with the reason.
 */
const ACROSS_MERCHANTS: { text: string; why: string }[] = [
  { text: 'from "spend_key_reservations" as "r" left join "requests" as "q"', why: "the sweep of spend-key reservations whose record ended, all merchants' at once" },
];

const KEYWORDS = new Set(['where', 'set', 'on', 'inner', 'left', 'right', 'join', 'group', 'order', 'limit', 'select', 'values', 'cross', 'using', 'returning', 'for', 'having', 'union', 'offset', 'as']);

type Reference = { table: string; alias: string; columns?: string[] };

/**
 * The tables a statement reads or writes (after FROM, JOIN, UPDATE, DELETE FROM or INSERT INTO),
 * each with the name the statement knows it by, and for an insert its column list.
 */
function referencesOf(statement: string): Reference[] {
  const refs: Reference[] = [];
  const pattern = /\b(from|join|update|into)\s+"?([a-z_][a-z0-9_]*)"?(?:\s+(?:as\s+)?"?([a-z_][a-z0-9_]*)"?)?(?:\s*\(([^)]*)\))?/gi;
  for (const m of statement.matchAll(pattern)) {
    const table = m[2]!.toLowerCase();
    const alias = m[3] && !KEYWORDS.has(m[3].toLowerCase()) ? m[3].toLowerCase() : table;
    const columns = m[1]!.toLowerCase() === 'into' && m[4] ? m[4].split(',').map((c) => c.trim().replace(/"/g, '').toLowerCase()) : undefined;
    refs.push({ table, alias, ...(columns ? { columns } : {}) });
  }
  return refs;
}

/**
 * Whether the statement names the merchant for this reference: its merchant_id column, or bare
 * `merchant_id` when it is the statement's only table. Outside what it selects or returns: a
 * statement that reads merchant_id back without selecting by it does not name the merchant.
 */
function namesMerchant(statement: string, ref: Reference, refs: Reference[]): boolean {
  if (ref.columns) return ref.columns.includes('merchant_id');
  const text = statement
    .toLowerCase()
    .replace(/"/g, '')
    .replace(/\bselect\b[\s\S]*?\bfrom\b/g, 'select from')
    .replace(/\breturning\b[\s\S]*$/, '');
  if (text.includes(`${ref.alias}.merchant_id`)) return true;
  return refs.length === 1 && /\bmerchant_id\b/.test(text);
}

// Ready to shard by merchant: the statements representative flows send (the gateway's admission
// and settlement, recorded usage, a grant, reports and lists under each filter, the overview's
// leaders, ledger verification, the hold sweep), as PostgreSQL itself saw them
// (pg_stat_statements on a throwaway server), so raw SQL and the pipelined batches are checked as
// well as the query builder's.
describe.skipIf(!databasesUnderTest().includes('postgres'))('statements of representative flows on per-request and ledger tables', () => {
  let cluster: PostgresCluster;
  let upstream: MockUpstream;
  let t: TestApp;
  let statements: string[] = [];

  beforeAll(async () => {
    cluster = await startPostgresCluster(['shared_preload_libraries=pg_stat_statements', 'pg_stat_statements.max=5000', 'pg_stat_statements.track=all']);
    const admin = new pg.Client({ connectionString: cluster.url });
    await admin.connect();
    await admin.query('create extension pg_stat_statements');
    let base: string;
    ({ upstream, t, base } = await startGatewayOnMock('postgres', {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-managed-openai' },
      database: { dialect: 'postgres', url: cluster.url },
    }));
    await admin.query('select pg_stat_statements_reset()');
    await representativeFlows(t, base);
    const { rows } = await admin.query<{ query: string }>('select query from pg_stat_statements');
    statements = rows.map((r) => r.query);
    await admin.end();
  }, CLUSTER_START_TIMEOUT_MS);
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
    await cluster?.destroy();
  });

  const onPerMerchantTables = () => statements.filter((s) => referencesOf(s).some((r) => PER_MERCHANT_TABLES.includes(r.table)));

  it('exercise every per-request and ledger table', () => {
    const touched = new Set(onPerMerchantTables().flatMap((s) => referencesOf(s).map((r) => r.table)));
    expect(PER_MERCHANT_TABLES.filter((table) => !touched.has(table))).toEqual([]);
  });

  it('find merchant_id on every per-request and ledger table but the known few', async () => {
    const client = new pg.Client({ connectionString: cluster.url });
    await client.connect();
    try {
      const { rows } = await client.query<{ table_name: string }>(
        "select table_name from information_schema.columns where table_schema = 'public' and column_name = 'merchant_id'",
      );
      const carrying = new Set(rows.map((r) => r.table_name));
      expect(PER_MERCHANT_TABLES.filter((table) => !carrying.has(table)).sort()).toEqual(WITHOUT_MERCHANT_ID);
    } finally {
      await client.end();
    }
  });

  it('name the merchant for each such table they read or write, inserts included', () => {
    const checked = PER_MERCHANT_TABLES.filter((table) => !WITHOUT_MERCHANT_ID.includes(table));
    const lacking = onPerMerchantTables()
      .filter((s) => !ACROSS_MERCHANTS.some((known) => s.includes(known.text)))
      .flatMap((s) => {
        const refs = referencesOf(s);
        return refs.filter((r) => checked.includes(r.table) && !namesMerchant(s, r, refs)).map((r) => `${r.table} (as ${r.alias}) in: ${s}`);
      });
    expect(lacking).toEqual([]);
  });

  it('still send the statements listed as spanning every merchant (else the list is out of date)', () => {
    for (const known of ACROSS_MERCHANTS) expect(statements.some((s) => s.includes(known.text)), known.why).toBe(true);
  });
});

async function representativeFlows(t: TestApp, base: string): Promise<void> {
  const h = t.auth();
  const post = async (url: string, payload: object) => {
    const res = await t.app.inject({ method: 'POST', url, headers: h, payload });
    expect(res.statusCode, `${url}: ${res.body}`).toBeLessThan(300);
    return res.json();
  };
  const get = async (url: string) => {
    const res = await t.app.inject({ method: 'GET', url, headers: h });
    expect(res.statusCode, `${url}: ${res.body}`).toBe(200);
    return res.json();
  };
  const customer = await post('/v1/customers', { reference_id: 'guard-1' });
  const meter = await post('/v1/meters', { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '100' }] });
  await post(`/v1/customers/${customer.customer_id}/credits`, { amount: '10' });

  // The gateway: admission, hold, relay, settlement.
  const token = Buffer.from(JSON.stringify({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug })).toString('base64');
  for (let i = 0; i < 3; i++) {
    const res = await fetch(`${base}/v1/forward?${OPENAI_CHAT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'x-service-metadata': JSON.stringify({ team: 'a' }) },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 7 }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await t.settledRecord(res.headers.get('x-tollgate-request-id'));
  }

  // Recorded usage, with metadata.
  for (let i = 0; i < 3; i++) {
    await post('/v1/requests', {
      request_id: `guard-${i}`,
      customer_id: customer.customer_id,
      meter_slug: meter.meter_slug,
      input_tokens: 100,
      output_tokens: 50,
      metadata: { team: 'a', user: `u${i}` },
    });
  }

  // Reports and lists, under each filter.
  const today = new Date(t.clock.now()).toISOString().slice(0, 10);
  const pairs = (p: string[][]) => `&metadata_filters=${encodeURIComponent(JSON.stringify(p))}`;
  for (const filter of ['', `&customer_id=${customer.customer_id}`, `&meter_id=${meter.meter_id}`, pairs([['team', 'a']]), pairs([['team', 'a'], ['user', 'u1']])]) {
    await get(`/v1/usage?start=${today}${filter}`);
    await get(`/v1/requests?limit=2${filter}`);
  }
  const page = await get('/v1/requests?limit=2');
  await get(`/v1/requests?limit=2&cursor=${page.next_cursor}`);
  await get(`/v1/requests/guard-1`);
  await get(`/v1/customers/${customer.customer_id}`);
  // The dashboard overview's leaders (top customers and models).
  await usageLeaders(t.storage, t.merchant.merchantId, { start: today }, new Date(t.clock.now()), 5);

  // Ledger maintenance.
  expect((await verifyLedger(t.storage)).problems).toEqual([]);
  await sweepExpiredHolds(t.storage, new Date(t.clock.now()));
}
