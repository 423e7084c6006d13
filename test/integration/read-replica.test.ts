import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { startServer } from '../../src/main.ts';
import { postgresPool, reportsOf } from '../../src/storage/db.ts';
import { openReadReplica } from '../../src/storage/read-replica.ts';
import type { Database } from '../../src/storage/schema.ts';
import { startTestApp, type CustomerWithMeter, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { CLUSTER_START_TIMEOUT_MS, startReplicaCluster, type ReplicaCluster } from '../helpers/replica-cluster.ts';
import { until } from '../helpers/until.ts';

type Ready = { status: string; replica?: { status: string; lag_seconds?: number; lag_bytes?: number } };

// A throwaway primary and its streaming replica, two clusters of their own (the shared server is
// left alone); they run wherever PostgreSQL does, CI included.
describe.skipIf(!databasesUnderTest().includes('postgres'))('reports read from a streaming replica (DATABASE_READ_URL)', () => {
  let cluster: ReplicaCluster;
  let t: TestApp;
  let payer: CustomerWithMeter;
  let recorded = 0;

  beforeAll(async () => {
    cluster = await startReplicaCluster();
    t = await startTestApp('postgres', {
      database: { dialect: 'postgres', url: cluster.primaryUrl },
      env: { DATABASE_READ_URL: cluster.replicaUrl },
    });
    payer = await t.customerWithMeter({ credit: '100' });
  }, CLUSTER_START_TIMEOUT_MS);
  afterAll(async () => {
    await t?.close();
    await cluster?.destroy();
  });

  /** Runs a statement on the replica itself (pausing and resuming its replay). */
  async function onReplica(text: string): Promise<void> {
    const client = new pg.Client({ connectionString: cluster.replicaUrl });
    await client.connect();
    try {
      await client.query(text);
    } finally {
      await client.end();
    }
  }

  async function recordRequest(): Promise<string> {
    const requestId = `replica-${++recorded}`;
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(),
      payload: { request_id: requestId, customer_id: payer.customerId, meter_slug: payer.meterSlug, input_tokens: 10, output_tokens: 5 },
    });
    expect(res.statusCode).toBe(201);
    return requestId;
  }

  const today = () => new Date(t.clock.now()).toISOString().slice(0, 10);
  async function usageCount(): Promise<number> {
    const res = await t.app.inject({ method: 'GET', url: `/v1/usage?start=${today()}`, headers: t.auth() });
    expect(res.statusCode).toBe(200);
    return res.json().totals.total_requests;
  }
  async function listedIds(): Promise<string[]> {
    const res = await t.app.inject({ method: 'GET', url: '/v1/requests?limit=100', headers: t.auth() });
    expect(res.statusCode).toBe(200);
    return res.json().data.map((r: { request_id: string }) => r.request_id);
  }
  async function ready(): Promise<Ready> {
    return (await t.app.inject({ method: 'GET', url: '/readyz' })).json();
  }
  async function metrics(): Promise<string> {
    return (await t.app.inject({ method: 'GET', url: '/metrics' })).body;
  }
  const metric = (text: string, name: string) => text.split('\n').find((l) => l.startsWith(`${name} `))?.slice(name.length + 1);

  it('runs report sessions on the replica with jit = off, as the primary does', async () => {
    const reads = reportsOf(t.storage);
    expect(reads).not.toBe(t.storage);
    const { rows } = await sql<{ jit: string; in_recovery: boolean }>`select current_setting('jit') as jit, pg_is_in_recovery() as in_recovery`.execute(reads.db);
    expect(rows[0]).toEqual({ jit: 'off', in_recovery: true });
  });

  it('is what a server started from DATABASE_URL and DATABASE_READ_URL reads its reports from', async () => {
    const server = await startServer(
      loadConfig({ PORT: '0', DATABASE_URL: cluster.primaryUrl, DATABASE_READ_URL: cluster.replicaUrl, CALL_JOURNAL_DIR: 'off', LOG_LEVEL: 'silent' }),
    );
    try {
      const res = await fetch(`${server.url}/readyz`);
      expect(res.status).toBe(200);
      expect(await res.json()).toMatchObject({ status: 'ready', database: 'postgres', replica: { status: 'streaming' } });
    } finally {
      await server.stop();
    }
  });

  it('shows a write in the usage report and request list once the replica has replayed it, and the lag meanwhile', async () => {
    const before = await usageCount();
    await onReplica('select pg_wal_replay_pause()');
    try {
      const requestId = await recordRequest();
      // The primary has it (a single record is read there); the reports, read on the paused replica, do not yet.
      expect((await t.app.inject({ method: 'GET', url: `/v1/requests/${requestId}`, headers: t.auth() })).statusCode).toBe(200);
      expect(await usageCount()).toBe(before);
      expect(await listedIds()).not.toContain(requestId);
      const lagging = await ready();
      expect(lagging.status).toBe('ready');
      expect(lagging.replica?.status).toBe('streaming');
      expect(lagging.replica?.lag_bytes).toBeGreaterThan(0);
      expect(lagging.replica?.lag_seconds).toBeGreaterThan(0);
      expect(Number(metric(await metrics(), 'tollgate_replica_lag_bytes'))).toBeGreaterThan(0);

      await onReplica('select pg_wal_replay_resume()');
      await until(async () => (await usageCount()) === before + 1, 'the replica to replay the write', { timeoutMs: 10_000, intervalMs: 20 });
      expect(await listedIds()).toContain(requestId);
      const caughtUp = await until(
        async () => {
          const r = await ready();
          return r.replica?.lag_bytes === 0 && r;
        },
        'readyz to show no lag',
        { timeoutMs: 10_000, intervalMs: 20 },
      );
      expect(caughtUp.replica).toEqual({ status: 'streaming', lag_seconds: 0, lag_bytes: 0 });
      expect(metric(await metrics(), 'tollgate_replica_up')).toBe('1');
    } finally {
      await onReplica('select pg_wal_replay_resume()').catch(() => {});
    }
  });

  it('reads reports from the primary while the replica is stopped (readyz degraded, not failing), and from the replica again once it is back', async () => {
    await cluster.stopReplica();
    try {
      const requestId = await recordRequest();
      // Read from the primary: the write shows at once, with no replica to replay it.
      expect(await listedIds()).toContain(requestId);
      const count = await usageCount();
      expect(count).toBe(recorded);
      const down = await ready();
      expect(down).toMatchObject({ status: 'degraded', database: 'postgres', replica: { status: 'unreachable' } });
      const scraped = await metrics();
      expect(metric(scraped, 'tollgate_replica_up')).toBe('0');
      expect(Number(metric(scraped, 'tollgate_replica_lag_seconds'))).toBeNaN();
    } finally {
      await cluster.startReplica();
    }
    await until(async () => metric(await metrics(), 'tollgate_replica_up') === '1', 'reports to read from the replica again', { timeoutMs: 10_000, intervalMs: 20 });
    const { rows } = await sql<{ in_recovery: boolean }>`select pg_is_in_recovery() as in_recovery`.execute(reportsOf(t.storage).db);
    expect(rows[0]?.in_recovery).toBe(true);
    expect((await ready()).status).toBe('ready');
  });

  it('ends the replica pool on close even when no report query ever ran through it (only its lag was measured)', async () => {
    const opened: pg.Pool[] = [];
    const openPool: typeof postgresPool = (...args) => {
      const pool = postgresPool(...args);
      opened.push(pool);
      return pool;
    };
    const primary = postgresPool(cluster.primaryUrl, 2, false);
    const primaryDb = new Kysely<Database>({ dialect: new PostgresDialect({ pool: primary }) });
    const replica = openReadReplica(cluster.replicaUrl, { primary, primaryDb, max: 2, openPool, describe: 'replica under test' });
    try {
      expect((await replica.lag()).status).toBe('streaming');
      expect(opened).toHaveLength(1);
      expect(opened[0]!.totalCount).toBeGreaterThan(0);
    } finally {
      await replica.close();
      await primaryDb.destroy();
    }
    expect(opened[0]!.ended).toBe(true);
    expect(opened[0]!.totalCount).toBe(0);
  });
});
