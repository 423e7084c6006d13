/**
 * What the call journal (decision 0024) costs a forwarded call: the same non-streaming chat through
 * a server with the journal off and one with it on, the added p50 at one connection (against a
 * direct call to the mock) and the gateway's CPU per request at 32 connections (settlements
 * included), and the journal's share of each; the target is within 10 % of the journal off.
 *
 * Both servers run at once, each on a fresh database of the engine, so both see the same moment of
 * a shared host: one connection sends to the mock, the server with the journal off and the one
 * with it on in turn, request by request, and the 32-connection loads of the two run side by side.
 * Measured one server after the other instead, the host's load moved between the two windows by
 * more than the journal costs (decision 0024, *Measured*).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { verifyLedger } from '../src/ledger/verify.ts';
import { openStorage, type Storage } from '../src/storage/db.ts';
import { migrateToLatest } from '../src/storage/migrate.ts';
import { benchPostgresUrl, freshPostgresSchema, freshSqlite, type BenchDatabase } from './databases.ts';
import { forwardClient, measure, waitForSettlements, type GatewayRow } from './gateway.ts';
import { cpuMs, machineTicks, stealPercent } from './process-stats.ts';

const CONNECTIONS = 32;
const BODY = JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 8, messages: [{ role: 'user', content: 'Say something short please' }] });
const MODES = ['off', 'on'] as const;

type Mode = (typeof MODES)[number];
type Figures = { addedP50: number[]; cpuMs: number; ok: number; non2xx: number };

/** Starts a server with `env` added to the bench's, runs `work` against it, stops it. */
export type WithServer = (env: Record<string, string>, work: (server: { url: string; pid: number }) => Promise<void>) => Promise<void>;

type Target = { url: string; headers: Record<string, string> };
type Running = Target & { mode: Mode; pid: number; storage: Storage; merchantId: string };

export async function benchCallJournal(opts: { engine: string; withServer: WithServer; mockUrl: string; seconds: number; rounds: number }): Promise<GatewayRow[]> {
  const figures: Record<Mode, Figures> = { off: { addedP50: [], cpuMs: 0, ok: 0, non2xx: 0 }, on: { addedP50: [], cpuMs: 0, ok: 0, non2xx: 0 } };
  const journalDir = mkdtempSync(join(tmpdir(), 'tollgate-bench-journal-'));
  const databases: Record<Mode, { database: BenchDatabase; storage: Storage }> = { off: await freshDatabase(opts.engine), on: await freshDatabase(opts.engine) };
  const ticksBefore = machineTicks();
  // A failed or interrupted round must not leave its databases and journal behind either.
  try {
    try {
      for (let round = 0; round < opts.rounds; round++) {
        // Which server starts first (and is asked first) alternates from round to round.
        const order = round % 2 === 0 ? MODES : ([...MODES].reverse() as Mode[]);
        await withBoth(opts, order, journalDir, databases, (running) => measureRound(opts, running, figures));
      }
    } finally {
      for (const mode of MODES) await databases[mode].storage.close();
    }
    const ledgers = await Promise.all(MODES.map(async (mode) => (await verifiedLedger(databases[mode].database)).problems.length));
    return rowsOf(opts, figures, ticksBefore, ledgers[0]! + ledgers[1]!);
  } finally {
    for (const mode of MODES) await databases[mode].database.drop();
    rmSync(journalDir, { recursive: true, force: true });
  }
}

async function freshDatabase(engine: string): Promise<{ database: BenchDatabase; storage: Storage }> {
  const database = engine === 'postgres' ? await freshPostgresSchema(benchPostgresUrl()!) : freshSqlite();
  const storage = openStorage(database.url, { poolSize: 2 });
  await migrateToLatest(storage);
  // Schemas are named by the millisecond: the next one must not get the same name.
  await new Promise((resolve) => setTimeout(resolve, 2));
  return { database, storage };
}

async function verifiedLedger(database: BenchDatabase) {
  const storage = openStorage(database.url, { poolSize: 2 });
  try {
    return await verifyLedger(storage);
  } finally {
    await storage.close();
  }
}

/** Starts the two servers (in `order`), each with its own merchant and database, runs `work`, stops them. */
async function withBoth(
  opts: { withServer: WithServer },
  order: readonly Mode[],
  journalDir: string,
  databases: Record<Mode, { database: BenchDatabase; storage: Storage }>,
  work: (running: Running[]) => Promise<void>,
): Promise<void> {
  const running: Running[] = [];
  const start = async (i: number): Promise<void> => {
    if (i === order.length) return work(running);
    const mode = order[i]!;
    const { database, storage } = databases[mode];
    const env = { DATABASE_URL: database.url, CALL_JOURNAL_DIR: mode === 'off' ? 'off' : journalDir };
    await opts.withServer(env, async (server) => {
      const { forwardUrl, forwardHeaders, merchantId } = await forwardClient(storage, server.url);
      running.push({ mode, pid: server.pid, storage, merchantId, url: forwardUrl, headers: forwardHeaders });
      await start(i + 1);
    });
  };
  await start(0);
}

async function measureRound(opts: { mockUrl: string; seconds: number }, running: Running[], figures: Record<Mode, Figures>): Promise<void> {
  // The JIT settles on both loads' paths before anything is measured.
  await Promise.all(running.map((server) => measure(server.url, server.headers, BODY, CONNECTIONS, 1)));
  await Promise.all(running.map((server) => measure(server.url, server.headers, BODY, 1, 1)));
  await Promise.all(running.map((server) => waitForSettlements(server.storage, server.merchantId)));
  const direct: Target = { url: `${opts.mockUrl}/v1/chat/completions`, headers: { 'content-type': 'application/json', authorization: 'Bearer x' } };
  const [directP50, ...viaP50] = await interleavedP50s([direct, ...running], opts.seconds);
  running.forEach((server, i) => figures[server.mode].addedP50.push(viaP50[i]! - directP50!));
  const before = running.map((server) => cpuMs(server.pid));
  const loads = await Promise.all(running.map((server) => measure(server.url, server.headers, BODY, CONNECTIONS, opts.seconds)));
  await Promise.all(running.map((server) => waitForSettlements(server.storage, server.merchantId)));
  running.forEach((server, i) => {
    figures[server.mode].cpuMs += cpuMs(server.pid) - before[i]!;
    figures[server.mode].ok += loads[i]!.ok;
    figures[server.mode].non2xx += loads[i]!.non2xx;
  });
}

/**
 * One connection to each target, one request at a time, asking the targets in turn (forwards and
 * backwards, so none always follows the same one) for `seconds`: each target's p50 in ms.
 */
async function interleavedP50s(targets: Target[], seconds: number): Promise<number[]> {
  const pools = targets.map((target) => new Pool(new URL(target.url).origin, { connections: 1, pipelining: 1 }));
  const latencies: number[][] = targets.map(() => []);
  const until = performance.now() + seconds * 1000;
  try {
    for (let turn = 0; performance.now() < until; turn++) {
      for (let k = 0; k < targets.length; k++) {
        const i = turn % 2 === 0 ? k : targets.length - 1 - k;
        const url = new URL(targets[i]!.url);
        const started = performance.now();
        const res = await pools[i]!.request({ path: url.pathname + url.search, method: 'POST', headers: targets[i]!.headers, body: BODY });
        await res.body.arrayBuffer();
        if (res.statusCode === 200) latencies[i]!.push(performance.now() - started);
      }
    }
  } finally {
    await Promise.all(pools.map((pool) => pool.close()));
  }
  return latencies.map(median);
}

function rowsOf(opts: { engine: string; rounds: number }, figures: Record<Mode, Figures>, ticksBefore: { total: number; steal: number }, ledgerProblems: number): GatewayRow[] {
  const p50 = (mode: Mode) => median(figures[mode].addedP50);
  const cpu = (mode: Mode) => figures[mode].cpuMs / Math.max(1, figures[mode].ok);
  const share = (on: number, off: number) => `${on - off >= 0 ? '+' : ''}${(((on - off) / Math.max(off, 1e-9)) * 100).toFixed(1)} %`;
  const rows: GatewayRow[] = MODES.map((mode) => ({
    scenario: `forward non-streaming chat, call journal ${mode} (${opts.rounds} rounds, both servers at once)`,
    engine: opts.engine,
    result:
      `added p50 ${p50(mode).toFixed(3)} ms (1 connection, median of rounds [${figures[mode].addedP50.map((v) => v.toFixed(3)).join(', ')}]); ` +
      `gateway CPU ${cpu(mode).toFixed(3)} ms/request (${CONNECTIONS} connections, settlements included); ${figures[mode].non2xx} non-2xx`,
    target: '',
  }));
  const result =
    `added p50 ${share(p50('on'), p50('off'))} (${(p50('on') - p50('off')).toFixed(3)} ms), CPU/request ${share(cpu('on'), cpu('off'))} ` +
    `(${(cpu('on') - cpu('off')).toFixed(3)} ms); host steal ${stealPercent(ticksBefore).toFixed(1)} %; verify-ledger of both databases: ${ledgerProblems} problems`;
  console.log(`call journal's cost: ${result}`);
  rows.push({ scenario: "the call journal's cost (on against off)", engine: opts.engine, result, target: 'added p50 and CPU/request within 10 % of the journal off' });
  return rows;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)] ?? 0;
}
