/**
 * `npm run bench`: measures what the issues promise, against a real server process over loopback.
 *
 *   1. POST /v1/requests throughput (recorded requests per second) on SQLite and PostgreSQL.
 *   2. GET /v1/usage latency over 31 days with 1,000,000 stored requests, with and without a
 *      metadata filter (p50 / p95 / p99 of sequential calls).
 *   3. The forward gateway against a direct call to the same mock provider (bench/gateway.ts).
 *   4. Webhook delivery: events per second to a local receiver and end-to-end lag (bench/webhooks.ts).
 *   5. Rewrite proxy: CPU per request of an Anthropic client translated to an OpenAI-shaped mock, against forward (bench/rewrite.ts).
 *   6. Dashboard pages in Chromium: time to interactive and bytes transferred per page (bench/pages.ts).
 *   7. The call journal's cost: forward with the journal off and on, alternating (bench/call-journal.ts).
 *   8. Bytes on disk per recorded request, per table and index (bench/footprint.ts).
 *   9. After each engine's scenarios, the ledger rebuilt from its postings (verify-ledger): no problem.
 *
 * PostgreSQL comes from BENCH_DATABASE_URL or TEST_DATABASE_URL (a fresh schema is created);
 * without either, only SQLite runs. `--quick` shrinks every size for a smoke run. While working on
 * one scenario, `--only records|usage|gateway|webhooks|rewrite|pages|journal|footprint` (comma-separated) and
 * `--engine sqlite|postgres` narrow the run; the report then holds only what ran. `--cpu-prof DIR` writes each server's V8
 * CPU profile to DIR.
 * The report is printed and written to bench/results/latest.md.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import autocannon from 'autocannon';
import { sql } from 'kysely';
import { parseMoney } from '../src/domain/money.ts';
import { verifyLedger } from '../src/ledger/verify.ts';
import { creditWallet } from '../src/ledger/wallets.ts';
import { openStorage, type Storage } from '../src/storage/db.ts';
import { createMerchant } from '../src/storage/merchants.ts';
import { migrateToLatest } from '../src/storage/migrate.ts';
import { benchPostgresUrl, freshPostgresSchema, freshSqlite } from './databases.ts';
import { benchGateway, startMock } from './gateway.ts';
import { cpuMs, localPostgresCpuMs } from './process-stats.ts';
import { benchPages } from './pages.ts';
import { benchRewrite } from './rewrite.ts';
import { benchWebhooks } from './webhooks.ts';
import { benchCallJournal } from './call-journal.ts';
import { benchFootprint } from './footprint.ts';

const quick = process.argv.includes('--quick');
const optionList = (name: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]?.split(',') : undefined;
};
const only = optionList('--only');
const runs = (scenario: 'records' | 'usage' | 'gateway' | 'webhooks' | 'rewrite' | 'pages' | 'journal' | 'footprint') => !only || only.includes(scenario);
const onlyEngines = optionList('--engine');
/** `--cpu-prof DIR`: each server writes its V8 CPU profile to DIR when it exits. */
const profileDir = optionList('--cpu-prof')?.[0];
const serverNodeArgs = profileDir ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : [];
const SIZES = {
  throughputSeconds: quick ? 3 : 15,
  warmUpSeconds: quick ? 1 : 3,
  connections: 32,
  customers: quick ? 10 : 200,
  storedRequests: quick ? 20_000 : 1_000_000,
  usageCalls: quick ? 20 : 200,
  gatewaySeconds: quick ? 2 : 10,
  webhookBurst: quick ? 500 : 5_000,
  webhookRateSeconds: quick ? 2 : 10,
  pageVisits: quick ? 3 : 10,
  pageRequests: quick ? 50 : 500,
  footprintRequests: quick ? 5_000 : 50_000,
};

type Row = { scenario: string; engine: string; result: string; target: string };
const report: Row[] = [];

async function main(): Promise<void> {
  const engines: { name: string; url: string; drop(): Promise<void> }[] = [{ name: 'sqlite', ...freshSqlite() }];
  const pgBase = benchPostgresUrl();
  if (pgBase) engines.push({ name: 'postgres', ...(await freshPostgresSchema(pgBase)) });
  else console.warn('No BENCH_DATABASE_URL / TEST_DATABASE_URL: PostgreSQL scenarios skipped.');

  if (onlyEngines) {
    for (const skipped of engines.filter((e) => !onlyEngines.includes(e.name))) await skipped.drop();
    engines.splice(0, engines.length, ...engines.filter((e) => onlyEngines.includes(e.name)));
  }
  const mock = await startMock();
  // A scenario that fails must not leave the bench databases behind (or the mock running).
  try {
    process.env.BENCH_MOCK_URL = mock.url;
    for (const engine of engines) {
      console.log(`\n== ${engine.name}`);
      const storage = openStorage(engine.url, { poolSize: 4 });
      await migrateToLatest(storage);
      try {
        if (runs('records') || runs('usage')) {
          await withServer(engine.url, mock.url, async (server) => {
            if (runs('records')) await benchRecordThroughput(engine.name, storage, server.url, server.process.pid!);
            if (runs('usage')) await benchUsageLatency(engine.name, storage, server.url);
          });
        }
        // A fresh server, so its peak RSS is the gateway's own, not what the million-row seed left behind.
        if (runs('gateway')) await withServer(engine.url, mock.url, async (server) => {
          report.push(
            ...(await benchGateway({ engine: engine.name, storage, serverUrl: server.url, serverPid: server.process.pid!, mock, seconds: SIZES.gatewaySeconds })),
          );
        });
        if (runs('webhooks')) await withServer(engine.url, mock.url, async (server) => {
          report.push(...(await benchWebhooks({ engine: engine.name, storage, serverUrl: server.url, burst: SIZES.webhookBurst, rateSeconds: SIZES.webhookRateSeconds })));
        });
        if (runs('rewrite')) await withServer(engine.url, mock.url, async (server) => {
          report.push(...(await benchRewrite({ engine: engine.name, storage, serverUrl: server.url, serverPid: server.process.pid!, seconds: SIZES.gatewaySeconds })));
        });
        if (runs('journal')) {
          const serve = (env: Record<string, string>, work: (server: { url: string; pid: number }) => Promise<void>) =>
            withServer(engine.url, mock.url, (server) => work({ url: server.url, pid: server.process.pid! }), env);
          report.push(...(await benchCallJournal({ engine: engine.name, withServer: serve, mockUrl: mock.url, seconds: SIZES.gatewaySeconds / 2, rounds: quick ? 1 : 3 })));
        }
        if (runs('pages')) await withServer(engine.url, mock.url, async (server) => {
          report.push(...(await benchPages({ engine: engine.name, storage, serverUrl: server.url, visits: SIZES.pageVisits, requests: SIZES.pageRequests })));
        });
        if (runs('footprint')) await withServer(engine.url, mock.url, async (server) => {
          const { headers, meter, customers } = await setUpMerchant(storage, server.url, SIZES.customers);
          const sqlitePath = engine.name === 'sqlite' ? engine.url.slice('sqlite:'.length) : undefined;
          report.push(
            ...(await benchFootprint({ engine: engine.name, storage, sqlitePath, serverUrl: server.url, requests: SIZES.footprintRequests, customers, meterSlug: meter.meter_slug, headers })),
          );
        });
        // The same guarantees after the load as before it (verify-ledger in docs/benchmarks.md). Every server has stopped (and
        // drained its writers), so every settlement of every scenario is in the ledger by now.
        report.push(await verifiedLedger(engine.name, storage));
      } finally {
        await storage.close();
      }
    }
  } finally {
    for (const engine of engines) await engine.drop();
    mock.process.kill('SIGTERM');
  }
  writeReport();
}

async function verifiedLedger(engine: string, storage: Storage): Promise<Row> {
  const { problems, wallets, transactions } = await verifyLedger(storage);
  for (const p of problems.slice(0, 10)) console.error(`verify-ledger: ${p.kind} ${p.id}: ${p.detail}`);
  const result = `${problems.length} problem${problems.length === 1 ? '' : 's'} in ${transactions} transactions, ${wallets} wallets`;
  console.log(`verify-ledger after the scenarios: ${result}`);
  return { scenario: 'verify-ledger after the scenarios above', engine, result, target: 'no problem' };
}

async function withServer(databaseUrl: string, mockUrl: string, work: (server: { url: string; process: ChildProcess }) => Promise<void>, env: Record<string, string> = {}) {
  const server = await startServer(databaseUrl, mockUrl, env);
  try {
    await work(server);
  } finally {
    const exited = new Promise((r) => server.process.once('exit', r));
    server.process.kill('SIGTERM');
    await exited;
  }
}

async function startServer(databaseUrl: string, mockUrl: string, env: Record<string, string> = {}): Promise<{ url: string; process: ChildProcess }> {
  const port = 18_000 + Math.floor(Math.random() * 2000);
  const child = spawn('node', [...serverNodeArgs, 'bin/tollgate.js', 'serve'], {
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      PORT: String(port),
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_MINUTE: '100000000',
      UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': mockUrl }),
      PROVIDER_KEYS: JSON.stringify({ openai: 'sk-bench' }),
      // The webhook bench's receiver is a plain http server on loopback.
      WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true',
      ...env,
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${url}/readyz`)).ok) return { url, process: child };
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  child.kill();
  throw new Error('server did not start');
}

async function setUpMerchant(storage: Storage, url: string, customers: number) {
  const { secretKey, merchant } = await createMerchant(storage, { name: 'Bench' }, new Date().toISOString());
  const headers = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
  const post = async (path: string, body: object) =>
    (await (await fetch(`${url}/v1${path}`, { method: "POST", headers, body: JSON.stringify(body) })).json()) as unknown;
  const meter = (await post('/meters', {
    name: 'Tokens',
    rate_type: 'fixed',
    tier_type: 'tokens_1m',
    tiers: [{ start: '0', rate: '2.5' }, { start: '1000000', rate: '2' }],
  })) as { meter_slug: string; meter_id: string };
  const ids: { customerId: string; walletId: string }[] = [];
  for (let i = 0; i < customers; i++) {
    const c = (await post('/customers', { reference_id: `bench-${i}` })) as { customer_id: string; wallet: { wallet_id: string } };
    await creditWallet(storage, c.wallet.wallet_id, parseMoney('1000000'), new Date().toISOString());
    ids.push({ customerId: c.customer_id, walletId: c.wallet.wallet_id });
  }
  return { headers, meter, customers: ids, merchantId: merchant.id, secretKey };
}

async function benchRecordThroughput(engine: string, storage: Storage, url: string, serverPid: number): Promise<void> {
  const { headers, meter, customers } = await setUpMerchant(storage, url, SIZES.customers);
  let n = 0;
  const run = (duration: number) =>
    autocannon({
      url: `${url}/v1/requests`,
      method: 'POST',
      headers,
      connections: SIZES.connections,
      duration,
      requests: [
        {
          setupRequest: (req) => {
            const i = n++;
            const customer = customers[i % customers.length]!;
            return {
              ...req,
              body: JSON.stringify({
                request_id: `bench-${i}`,
                customer_id: customer.customerId,
                meter_slug: meter.meter_slug,
                input_tokens: 800 + (i % 400),
                output_tokens: 200 + (i % 100),
                metadata: { feature: i % 2 ? 'chat' : 'search' },
              }),
            };
          },
        },
      ],
    });
  // Steady state is what is measured: a short warm-up (new request_ids too) lets the JIT compile the path.
  await run(SIZES.warmUpSeconds);
  // CPU per recorded request: steadier than the rate on a host whose speed drifts (see the A/B runs in docs/benchmarks.md).
  const cpuBefore = { server: cpuMs(serverPid), postgres: engine === 'postgres' ? localPostgresCpuMs() : 0 };
  const result = await run(SIZES.throughputSeconds);
  const ok = result['2xx'];
  const serverCpu = (cpuMs(serverPid) - cpuBefore.server) / Math.max(1, ok);
  const postgresCpu = engine === 'postgres' ? `, PostgreSQL ${((localPostgresCpuMs() - cpuBefore.postgres) / Math.max(1, ok)).toFixed(3)} ms` : '';
  const cpu = `CPU per record: server ${serverCpu.toFixed(3)} ms${postgresCpu}`;
  const rps = ok / (result.duration || SIZES.throughputSeconds);
  console.log(`POST /v1/requests: ${rps.toFixed(0)} recorded/s (${ok} ok, ${result.non2xx} non-2xx, p99 ${result.latency.p99} ms; ${cpu})`);
  report.push({
    scenario: `POST /v1/requests, ${SIZES.connections} connections, ${SIZES.customers} customers`,
    engine,
    result: `${rps.toFixed(0)} recorded/s; latency p50 ${result.latency.p50} ms, p99 ${result.latency.p99} ms; ${cpu}; ${result.non2xx} non-2xx`,
    target: engine === 'postgres' ? '≥ 2,000 recorded/s' : '—',
  });
}

/** Seeds stored requests straight into the tables (as the app writes them), spread over 31 days. */
async function seedRequests(storage: Storage, merchantId: string, connectionId: string, meterId: string, count: number, from: Date) {
  const span = 31 * 86_400;
  const step = span / count;
  const t0 = Math.floor(from.getTime() / 1000);
  const pgTs = (e: string) => sql.raw(`to_char(to_timestamp(${e}) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`);
  const sqTs = (e: string) => sql.raw(`strftime('%Y-%m-%dT%H:%M:%fZ', ${e}, 'unixepoch')`);
  const ts = storage.dialect === 'postgres' ? pgTs : sqTs;
  const series =
    storage.dialect === 'postgres'
      ? sql.raw(`select i, (${t0} + floor((i - 1) * ${step}))::bigint as e from generate_series(1, ${count}) as i`)
      : sql.raw(`with recursive s(i) as (select 1 union all select i + 1 from s where i < ${count}) select i, ${t0} + cast((i - 1) * ${step} as integer) as e from s`);
  const pad = storage.dialect === 'postgres' ? sql.raw(`lpad(i::text, 10, '0')`) : sql.raw(`substr('0000000000' || i, -10, 10)`);
  const tier = sql.raw(`case when i % 10 = 0 then 'gold' else 'free' end`);
  await sql`
    insert into requests (id, merchant_id, request_id, body_hash, status, connection_id, meter_id, provider, model, endpoint,
      provider_key_type, response_id, provider_timestamp, metadata, input_tokens, output_tokens, input_characters,
      output_characters, input_seconds, output_seconds, input_cost, output_cost, base_cost_charged, base_cost_payer,
      fee_amount, rate_type, token_basis, breakdown, service_charge_amount, service_charge_payer, total_request_cost,
      total_wallet_cost, total_merchant_cost, usage_estimated, created_at, completed_at)
    select 'req_seed' || ${pad}, ${merchantId}, 'seed-' || ${pad}, null, 'completed', ${connectionId}, ${meterId}, 'openai',
      'gpt-4o', 'POST https://api.openai.com/v1/chat/completions', 'managed', null, null,
      '{"tier":"' || ${tier} || '"}', 1000, 200, 0, 0, '0', '0', 25000000, 20000000, 1, 'wallet',
      30000000, 'fixed', 'input+output', '[]', 0, 'wallet', 75000000, 75000000, 0, 0, ${ts('e')}, ${ts('e')}
    from (${series}) as g`.execute(storage.db);
  await sql`
    insert into request_metadata (request_pk, merchant_id, key, value, created_at)
    select id, merchant_id, 'tier', case when metadata like '%gold%' then 'gold' else 'free' end, created_at
    from requests where merchant_id = ${merchantId} and id like 'req_seed%'`.execute(storage.db);
  const bucketOf = (createdAt: string) =>
    storage.dialect === 'postgres'
      ? sql.raw(`to_char(to_timestamp(floor(extract(epoch from ${createdAt}::timestamptz) / 900) * 900) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`)
      : sql.raw(`strftime('%Y-%m-%dT%H:%M:%fZ', (cast(strftime('%s', ${createdAt}) as integer) / 900) * 900, 'unixepoch')`);
  const bucket = bucketOf('created_at');
  const bucketOfRecord = bucketOf('r.created_at');
  await sql`
    insert into usage_rollups (merchant_id, bucket_start, connection_id, meter_id, requests, tokens, usage_cost, fee,
      service_charge, request_cost, wallet_cost, merchant_cost)
    select merchant_id, ${bucket}, connection_id, meter_id, count(*), sum(input_tokens + output_tokens),
      sum(input_cost + output_cost), sum(fee_amount), sum(service_charge_amount), sum(total_request_cost),
      sum(total_wallet_cost), sum(total_merchant_cost)
    from requests where merchant_id = ${merchantId} and id like 'req_seed%'
    group by merchant_id, ${bucket}, connection_id, meter_id
    on conflict (merchant_id, bucket_start, connection_id, meter_id) do nothing`.execute(storage.db);
  // The per-pair rollups every writer keeps too: GET /usage with one metadata pair reads them.
  await sql`
    insert into usage_rollups_by_metadata (merchant_id, key, value, bucket_start, connection_id, meter_id, requests, tokens,
      usage_cost, fee, service_charge, request_cost, wallet_cost, merchant_cost)
    select r.merchant_id, m.key, m.value, ${bucketOfRecord}, r.connection_id, r.meter_id, count(*), sum(r.input_tokens + r.output_tokens),
      sum(r.input_cost + r.output_cost), sum(r.fee_amount), sum(r.service_charge_amount), sum(r.total_request_cost),
      sum(r.total_wallet_cost), sum(r.total_merchant_cost)
    from requests r join request_metadata m on m.request_pk = r.id
    where r.merchant_id = ${merchantId} and r.id like 'req_seed%'
    group by r.merchant_id, m.key, m.value, ${bucketOfRecord}, r.connection_id, r.meter_id
    on conflict (merchant_id, key, value, bucket_start, connection_id, meter_id) do nothing`.execute(storage.db);
  if (storage.dialect === 'postgres') await sql`analyze`.execute(storage.db);
  else await sql`analyze`.execute(storage.db);
}

async function benchUsageLatency(engine: string, storage: Storage, url: string): Promise<void> {
  const { headers, meter, customers, merchantId } = await setUpMerchant(storage, url, 1);
  const from = new Date(Date.UTC(2026, 0, 1));
  const started = Date.now();
  await seedRequests(storage, merchantId, customers[0]!.customerId, meter.meter_id, SIZES.storedRequests, from);
  console.log(`seeded ${SIZES.storedRequests} requests in ${((Date.now() - started) / 1000).toFixed(1)} s`);

  const query = `start=2026-01-01T00:00:00-05:00&end=2026-01-31T23:59:59-05:00`;
  const filter = `&metadata_filters=${encodeURIComponent(JSON.stringify([['tier', 'gold']]))}`;
  for (const [label, qs] of [
    ['without metadata filter', query],
    ['with metadata filter', query + filter],
  ] as const) {
    const times: number[] = [];
    let requests = 0;
    for (let i = 0; i < SIZES.usageCalls; i++) {
      const t = performance.now();
      const res = await fetch(`${url}/v1/usage?${qs}`, { headers });
      const body = (await res.json()) as { totals?: { total_requests: number } };
      times.push(performance.now() - t);
      if (!res.ok) throw new Error(`GET /usage failed: ${JSON.stringify(body)}`);
      requests = body.totals?.total_requests ?? 0;
    }
    const p = percentiles(times);
    console.log(`GET /v1/usage ${label}: p50 ${p.p50} ms, p95 ${p.p95} ms, p99 ${p.p99} ms (${requests} requests counted)`);
    report.push({
      scenario: `GET /v1/usage, 31 days, ${SIZES.storedRequests.toLocaleString('en')} stored, ${label}`,
      engine,
      result: `p50 ${p.p50} ms, p95 ${p.p95} ms, p99 ${p.p99} ms (${SIZES.usageCalls} calls; counted ${requests})`,
      target: label.startsWith('without') ? 'p95 < 50 ms' : 'p95 < 500 ms',
    });
  }
}

function percentiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!.toFixed(1);
  return { p50: at(0.5), p95: at(0.95), p99: at(0.99) };
}

function writeReport(): void {
  const lines = [
    `# Benchmark report${quick ? ' (quick)' : ''}`,
    '',
    `${new Date().toISOString()} — node ${process.version}, ${process.platform}/${process.arch}`,
    '',
    '| scenario | engine | result | target |',
    '|---|---|---|---|',
    ...report.map((r) => `| ${r.scenario} | ${r.engine} | ${r.result} | ${r.target} |`),
    '',
  ];
  mkdirSync('bench/results', { recursive: true });
  writeFileSync('bench/results/latest.md', lines.join('\n'));
  console.log('\n' + lines.join('\n'));
}

await main();
