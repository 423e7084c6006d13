/**
 * Forward-gateway benchmark: the same chat completion sent straight to the mock provider and
 * through Tollgate (customer billing, metering and settlement on), at 1 and 32 connections,
 * non-streaming and streaming. Reports added latency, throughput relative to direct, the gateway
 * process's own CPU time per request and its peak RSS.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import autocannon from 'autocannon';
import { Pool } from 'undici';
import { parseMoney } from '../src/domain/money.ts';
import { creditWallet } from '../src/ledger/wallets.ts';
import type { Storage } from '../src/storage/db.ts';
import { createMerchant } from '../src/storage/merchants.ts';
import { cpuMs, cpuTimes, ioCounts, machineTicks, peakRssMb, rssMb, scheduleSince, stealPercent, threadSchedule, type Schedule } from './process-stats.ts';

export type GatewayRow = { scenario: string; engine: string; result: string; target: string };

/** The mock provider's process; `loopDelay` reads (and resets) its event-loop delay since the last read. */
export type Mock = { url: string; process: ChildProcess; loopDelay(): Promise<LoopDelay> };

export async function startMock(): Promise<Mock> {
  const child = spawn('node', ['--import', 'tsx', 'bench/mock-server.ts'], { stdio: ['ignore', 'pipe', 'inherit', 'ipc'] });
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.once('data', (d: Buffer) => resolve(d.toString().trim()));
    child.once('exit', () => reject(new Error('mock exited')));
  });
  // The IPC channel must not keep the bench alive once the mock is told to stop.
  child.channel?.unref();
  const loopDelay = () =>
    new Promise<LoopDelay>((resolve) => {
      child.once('message', (d: LoopDelay) => resolve(withoutSampling(d)));
      child.send('loop-delay');
    });
  return { url, process: child, loopDelay };
}


async function load(url: string, headers: Record<string, string>, body: string, connections: number, seconds: number) {
  return autocannon({ url, method: 'POST', headers, body, connections, duration: seconds });
}

/**
 * POSTs over a pool of connections, each timed with the high-resolution clock from a given start
 * (autocannon reports whole milliseconds, too coarse for a sub-millisecond added latency).
 */
class TimedPosts {
  readonly latencies: number[] = [];
  non2xx = 0;
  readonly #pool: Pool;
  readonly #path: string;

  constructor(url: string, connections: number) {
    this.#pool = new Pool(new URL(url).origin, { connections, pipelining: 1 });
    this.#path = new URL(url).pathname + new URL(url).search;
  }

  /** One request, its latency counted from `since` (performance.now()). */
  async post(headers: Record<string, string>, body: string, since: number): Promise<void> {
    const res = await this.#pool.request({ path: this.#path, method: 'POST', headers, body });
    await res.body.arrayBuffer();
    this.latencies.push(performance.now() - since);
    if (res.statusCode < 200 || res.statusCode > 299) this.non2xx++;
  }

  close(): Promise<void> {
    return this.#pool.close();
  }
}

/** One connection, one request at a time. */
async function sequential(url: string, headers: Record<string, string>, body: string, seconds: number) {
  const posts = new TimedPosts(url, 1);
  const until = performance.now() + seconds * 1000;
  try {
    while (performance.now() < until) await posts.post(headers, body, performance.now());
  } finally {
    await posts.close();
  }
  const { latencies, non2xx } = posts;
  return { ...percentiles(latencies), perSecond: latencies.length / seconds, ok: latencies.length - non2xx, non2xx, latencies };
}

function percentiles(latencies: number[]): { p50: number; p99: number } {
  const sorted = [...latencies].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? 0;
  return { p50: at(0.5), p99: at(0.99) };
}

/** A run's figures; a sequential run keeps its latencies, so slices combine into exact percentiles. */
type Measured = { p50: number; p99: number; perSecond: number; ok: number; non2xx: number; latencies?: number[] };

export async function measure(url: string, headers: Record<string, string>, body: string, connections: number, seconds: number): Promise<Measured> {
  if (connections === 1) return sequential(url, headers, body, seconds);
  const r = await load(url, headers, body, connections, seconds);
  return { p50: r.latency.p50, p99: r.latency.p99, perSecond: r.requests.average, ok: r['2xx'], non2xx: r.non2xx };
}

type Endpoint = { url: string; headers: Record<string, string> };

const SLICE_SECONDS = 2;

/** The server's event-loop delay over a stretch of time, in ms (what requests in flight wait for the thread). */
type LoopDelay = { p50: number; p99: number; max: number };

/**
 * prom-client samples the event loop with monitorEventLoopDelay every 10 ms (its default
 * precision) and each sample includes that interval, so it is taken off. Reading /metrics also
 * resets the histogram: read once before a stretch and once after it to get that stretch alone.
 */
const LOOP_SAMPLE_MS = 10;

const withoutSampling = (d: LoopDelay): LoopDelay => ({
  p50: Math.max(0, d.p50 - LOOP_SAMPLE_MS),
  p99: Math.max(0, d.p99 - LOOP_SAMPLE_MS),
  max: Math.max(0, d.max - LOOP_SAMPLE_MS),
});

async function readLoopDelay(serverUrl: string): Promise<LoopDelay> {
  const text = await (await fetch(`${serverUrl}/metrics`)).text();
  const gauge = (name: string) => {
    const match = new RegExp(`^tollgate_nodejs_eventloop_lag_${name}_seconds(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm').exec(text);
    if (!match) throw new Error(`/metrics has no tollgate_nodejs_eventloop_lag_${name}_seconds`);
    return Number(match[1]) * 1000;
  };
  return withoutSampling({ p50: gauge('p50'), p99: gauge('p99'), max: gauge('max') });
}

/** Slices' delays together: the median p50, the worst p99 and max (percentiles of slices cannot be merged exactly). */
function combinedLoopDelay(slices: LoopDelay[]): LoopDelay {
  const p50s = slices.map((d) => d.p50).sort((a, b) => a - b);
  return { p50: p50s[Math.floor((p50s.length - 1) / 2)]!, p99: Math.max(...slices.map((d) => d.p99)), max: Math.max(...slices.map((d) => d.max)) };
}

/**
 * Direct and gateway runs alternate in slices of about two seconds, so both see the same machine:
 * on this shared VM the direct rate alone moved by a third between back-to-back runs, which made a
 * ratio of two separate runs mostly noise. Rates are the slices' mean (they are of equal length);
 * percentiles are exact for sequential runs and the median of the slices' for autocannon's.
 */
async function measureAlternating(
  direct: Endpoint,
  via: Endpoint & { serverUrl: string; serverPid: number },
  body: string,
  connections: number,
  seconds: number,
  mock: Pick<Mock, 'process' | 'loopDelay'> | undefined,
) {
  const slices = Math.max(1, Math.round(seconds / SLICE_SECONDS));
  const runs = { direct: [] as Measured[], via: [] as Measured[] };
  const loopDelays: LoopDelay[] = [];
  const mockLoopDelays: LoopDelay[] = [];
  const schedule: Schedule = { mainRunMs: 0, mainWaitMs: 0, otherRunMs: 0 };
  let viaMs = 0;
  let mockCpuMs = 0;
  for (let i = 0; i < slices; i++) {
    const mockBefore = mock ? cpuMs(mock.process.pid!) : 0;
    await mock?.loopDelay();
    runs.direct.push(await measure(direct.url, direct.headers, body, connections, seconds / slices));
    if (mock) {
      mockLoopDelays.push(await mock.loopDelay());
      mockCpuMs += cpuMs(mock.process.pid!) - mockBefore;
    }
    // The gateway's loop is measured over its own slices only (it idles through the direct ones).
    await readLoopDelay(via.serverUrl);
    const scheduleBefore = threadSchedule(via.serverPid);
    const started = performance.now();
    runs.via.push(await measure(via.url, via.headers, body, connections, seconds / slices));
    viaMs += performance.now() - started;
    const slice = scheduleSince(via.serverPid, scheduleBefore);
    for (const key of Object.keys(schedule) as (keyof Schedule)[]) schedule[key] += slice[key];
    loopDelays.push(await readLoopDelay(via.serverUrl));
  }
  return {
    direct: combined(runs.direct),
    via: combined(runs.via),
    loopDelay: combinedLoopDelay(loopDelays),
    mockLoopDelay: mock ? combinedLoopDelay(mockLoopDelays) : null,
    mockCpuMs: mock ? mockCpuMs : null,
    /** The server's threads over the gateway slices, and how long those lasted. */
    schedule,
    viaMs,
  };
}

/**
 * Why the server's loop was late, over the gateway slices: its main thread's share of the time on a
 * CPU (near 100 %: saturated, every turn finds many requests ready) and runnable but waiting for a
 * CPU (the host's other processes, or the server's own other threads, had them), then the other
 * threads' CPU per request, and the mock's own event-loop delay over its direct slices (what the
 * same load and host do to a plain Node HTTP server).
 */
function loopContext(schedule: Schedule, viaMs: number, answered: number, mockLoopDelay: LoopDelay | null): string {
  const share = (ms: number) => `${((100 * ms) / Math.max(1, viaMs)).toFixed(0)} %`;
  return (
    `main thread on a CPU ${share(schedule.mainRunMs)} of the time, waiting for one ${share(schedule.mainWaitMs)}; ` +
    `other threads ${(schedule.otherRunMs / Math.max(1, answered)).toFixed(3)} ms CPU/request` +
    (mockLoopDelay ? `; the mock's own event-loop delay p99 ${mockLoopDelay.p99.toFixed(2)} ms, max ${mockLoopDelay.max.toFixed(1)} ms` : '')
  );
}

/**
 * The mock provider's own CPU per direct request: a plain Node HTTP server answering the same
 * call on the same host. Milliseconds of CPU differ from host to host (stop 15's host ran this
 * code ~1.7x slower than stop 14's), so the gateway's figure is also given as a multiple of it.
 */
function hostReference(mockCpuMs: number | null, direct: Measured, gatewayCpuPerRequest: number): string {
  if (mockCpuMs === null) return '';
  const mockPerRequest = mockCpuMs / Math.max(1, direct.ok);
  return ` (${(gatewayCpuPerRequest / Math.max(mockPerRequest, 1e-9)).toFixed(1)}x the mock's ${mockPerRequest.toFixed(3)} ms per direct request)`;
}

function combined(slices: Measured[]): Measured {
  const sumOf = (pick: (m: Measured) => number) => slices.reduce((total, m) => total + pick(m), 0);
  const latencies = slices.every((m) => m.latencies) ? slices.flatMap((m) => m.latencies!) : null;
  const medianOf = (pick: (m: Measured) => number) => {
    const sorted = slices.map(pick).sort((a, b) => a - b);
    return sorted[Math.floor((sorted.length - 1) / 2)]!;
  };
  return {
    ...(latencies ? percentiles(latencies) : { p50: medianOf((m) => m.p50), p99: medianOf((m) => m.p99) }),
    perSecond: sumOf((m) => m.perSecond) / slices.length,
    ok: sumOf((m) => m.ok),
    non2xx: sumOf((m) => m.non2xx),
  };
}

/**
 * Settlements run after the response; the CPU they cost belongs to the requests measured. A
 * request answered within its admission's write delay has no row at all until its settlement
 * writes it completed (decision 0011), so "no record pending" alone says nothing of settlements
 * still queued in the server: the merchant's records must also stop growing, over longer than the
 * settlement writer waits for company (25 ms) and the admission write delay (50 ms).
 */
export async function waitForSettlements(storage: Storage, merchantId: string): Promise<void> {
  const STEADY_POLLS = 3;
  let last = -1;
  let steady = 0;
  for (let i = 0; i < 1200; i++) {
    const counts = await storage.db
      .selectFrom('requests')
      .select((eb) => [eb.fn.countAll<number>().as('all'), eb.fn.sum<number>(eb.case().when('status', '=', 'pending').then(1).else(0).end()).as('pending')])
      .where('merchant_id', '=', merchantId)
      .executeTakeFirstOrThrow();
    const all = Number(counts.all);
    steady = Number(counts.pending ?? 0) === 0 && all === last ? steady + 1 : 0;
    if (steady >= STEADY_POLLS) return;
    last = all;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('settlements did not finish');
}

/** A merchant, a customer with a funded wallet and a meter: the forward URL and headers that bill them. */
export async function forwardClient(storage: Storage, serverUrl: string) {
  const { secretKey, merchant } = await createMerchant(storage, { name: 'Gateway bench' }, new Date().toISOString());
  await creditWallet(storage, merchant.wallet_id, parseMoney('1000000'), new Date().toISOString());
  const h = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
  const post = async (path: string, b: object) =>
    (await (await fetch(`${serverUrl}/v1${path}`, { method: 'POST', headers: h, body: JSON.stringify(b) })).json()) as unknown;
  const customer = (await post('/customers', {})) as { customer_id: string; wallet: { wallet_id: string } };
  const meter = (await post('/meters', { name: 'Bench chat', rate_type: 'fixed', tiers: [{ start: '0', rate: '1' }] })) as { meter_slug: string };
  await creditWallet(storage, customer.wallet.wallet_id, parseMoney('1000000'), new Date().toISOString());
  const token = Buffer.from(JSON.stringify({ secret_key: secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug })).toString('base64');
  return {
    forwardUrl: `${serverUrl}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`,
    forwardHeaders: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    merchantId: merchant.id,
  };
}

/** Steady state is what is measured: a short warm-up lets the JIT compile the gateway's path. */
async function warmUp(storage: Storage, forwardUrl: string, forwardHeaders: Record<string, string>, merchantId: string): Promise<void> {
  for (const stream of [false, true]) {
    const body = JSON.stringify({ model: 'gpt-4o', stream, max_tokens: 8, messages: [{ role: 'user', content: 'Warm up' }] });
    await load(forwardUrl, forwardHeaders, body, 8, 1);
  }
  await waitForSettlements(storage, merchantId);
}

const chatBody = (stream: boolean) =>
  JSON.stringify({ model: 'gpt-4o', stream, max_tokens: 8, messages: [{ role: 'user', content: 'Say something short please' }] });


/**
 * autocannon with `amount`, and when its last answer arrived: autocannon itself finishes only at its
 * next once-a-second tick, so its end would round every run's duration up to whole seconds.
 */
function loadOfFixedCount(opts: autocannon.Options): Promise<{ result: autocannon.Result; lastAnsweredAt: number }> {
  return new Promise((resolve, reject) => {
    let lastAnsweredAt = performance.now();
    const instance = autocannon(opts, (err, result) => (err ? reject(err) : resolve({ result, lastAnsweredAt })));
    instance.on('response', () => {
      lastAnsweredAt = performance.now();
    });
  });
}

/**
 * A fixed number of requests through the gateway alone, at one load, after every settlement: the
 * gateway's CPU, system calls and bytes written per request. Comparing two builds means running
 * this for each, alternately, several times: on this VM one run moves by ±10–15 %.
 */
export async function measureFixedCount(opts: { storage: Storage; serverUrl: string; serverPid: number; requests: number; connections: number; stream: boolean }): Promise<string> {
  const { forwardUrl, forwardHeaders, merchantId } = await forwardClient(opts.storage, opts.serverUrl);
  await warmUp(opts.storage, forwardUrl, forwardHeaders, merchantId);
  const body = chatBody(opts.stream);
  await autocannon({ url: forwardUrl, method: 'POST', headers: forwardHeaders, body, connections: opts.connections, amount: Math.min(5000, opts.requests) });
  await waitForSettlements(opts.storage, merchantId);
  const cpuBefore = cpuTimes(opts.serverPid);
  const ioBefore = ioCounts(opts.serverPid);
  const started = performance.now();
  const { result, lastAnsweredAt } = await loadOfFixedCount({ url: forwardUrl, method: 'POST', headers: forwardHeaders, body, connections: opts.connections, amount: opts.requests });
  const answeredAfterMs = lastAnsweredAt - started;
  await waitForSettlements(opts.storage, merchantId);
  const settledAfterMs = performance.now() - started;
  const answered = Math.max(1, result['2xx']);
  const io = ioCounts(opts.serverPid);
  const cpu = cpuTimes(opts.serverPid);
  const per = (n: number) => (n / answered).toFixed(2);
  const user = (cpu.user - cpuBefore.user) / answered;
  const system = (cpu.system - cpuBefore.system) / answered;
  return (
    `${opts.stream ? 'streaming' : 'non-streaming'}, ${opts.connections} connections, ${result['2xx']} answered (${result.non2xx} non-2xx): ` +
    `${((answered * 1000) / answeredAfterMs).toFixed(0)} answered/s, ${((answered * 1000) / settledAfterMs).toFixed(0)}/s counting until all are settled; ` +
    `gateway CPU ${(user + system).toFixed(3)} ms/request (${user.toFixed(3)} user, ${system.toFixed(3)} system; settlements included); ` +
    `per request ${per(io.syscr - ioBefore.syscr)} read and ${per(io.syscw - ioBefore.syscw)} write system calls, ` +
    `${((io.wchar - ioBefore.wchar) / answered / 1024).toFixed(1)} KiB written; peak RSS ${peakRssMb(opts.serverPid).toFixed(0)} MB`
  );
}

/** The paced scenario's rate, as a share of what the server answered unpaced at the same connections. */
const PACED_SHARE = 0.5;

/**
 * The same connections at a fixed rate the server can serve (PACED_SHARE of its unpaced rate), the
 * gateway alone: its event-loop delay when requests do not queue for its main thread, i.e. what
 * its own work in one piece (a settlement batch, a statement to the writer, a GC pause) costs the
 * requests in flight. Unpaced, the main thread is busy nearly all of the time and the delay is
 * mostly the queue (docs/benchmarks.md).
 */
async function measurePaced(
  url: string,
  headers: Record<string, string>,
  stream: boolean,
  connections: number,
  rate: number,
  opts: { engine: string; serverUrl: string; serverPid: number; seconds: number },
): Promise<GatewayRow> {
  await readLoopDelay(opts.serverUrl);
  const scheduleBefore = threadSchedule(opts.serverPid);
  const started = performance.now();
  const run = await pacedLoad(url, headers, chatBody(stream), connections, rate, opts.seconds);
  const schedule = scheduleSince(opts.serverPid, scheduleBefore);
  const elapsedMs = performance.now() - started;
  const loopDelay = await readLoopDelay(opts.serverUrl);
  const label = `forward ${stream ? 'streaming' : 'non-streaming'} chat, ${connections} connections paced at ${rate} req/s`;
  return {
    scenario: label,
    engine: opts.engine,
    result:
      `event-loop delay p50 ${loopDelay.p50.toFixed(2)} ms, p99 ${loopDelay.p99.toFixed(2)} ms, max ${loopDelay.max.toFixed(1)} ms ` +
      `(${loopContext(schedule, elapsedMs, run.ok, null)}); latency p50 ${run.p50.toFixed(2)} ms, p99 ${run.p99.toFixed(2)} ms; ` +
      `${(run.ok / (elapsedMs / 1000)).toFixed(0)} answered/s; ${run.non2xx} non-2xx`,
    target: 'event-loop delay p99 ≤ 2 ms',
  };
}

/**
 * Requests sent at an even rate over up to `connections` connections, each timed from when it was
 * due: autocannon's own rate limit sends each second's budget as fast as it can and then waits,
 * which saturates the server for part of every second.
 */
async function pacedLoad(url: string, headers: Record<string, string>, body: string, connections: number, rate: number, seconds: number) {
  const posts = new TimedPosts(url, connections);
  const inFlight: Promise<void>[] = [];
  const start = performance.now();
  const total = Math.round(rate * seconds);
  const dueAt = (n: number) => start + (n * 1000) / rate;
  try {
    for (let sent = 0; sent < total; ) {
      for (const now = performance.now(); sent < total && dueAt(sent) <= now; sent++) inFlight.push(posts.post(headers, body, dueAt(sent)));
      await new Promise((r) => setTimeout(r, 1));
    }
    await Promise.all(inFlight);
  } finally {
    await posts.close();
  }
  const { latencies, non2xx } = posts;
  return { ...percentiles(latencies), ok: latencies.length - non2xx, non2xx };
}

export async function benchGateway(opts: {
  engine: string;
  storage: Storage;
  serverUrl: string;
  serverPid: number;
  /** The mock provider: its CPU per direct request and its event-loop delay are reported as the host's reference. */
  mock?: Pick<Mock, 'process' | 'loopDelay'>;
  seconds: number;
  /** Defaults to [1, 32]. */
  connections?: number[];
  /** Defaults to [false, true]. */
  streams?: boolean[];
}): Promise<GatewayRow[]> {
  const rows: GatewayRow[] = [];
  const { storage } = opts;
  const { forwardUrl, forwardHeaders, merchantId } = await forwardClient(storage, opts.serverUrl);
  const mockUrl = process.env.BENCH_MOCK_URL!;
  await warmUp(storage, forwardUrl, forwardHeaders, merchantId);
  for (const stream of opts.streams ?? [false, true]) {
    const body = chatBody(stream);
    for (const connections of opts.connections ?? [1, 32]) {
      // A second of this very load first: one connection runs other paths (batches of one) than
      // the warm-up above, and the JIT settles on them before the measured run.
      await measure(forwardUrl, forwardHeaders, body, connections, 1);
      await waitForSettlements(storage, merchantId);
      // The gateway idles through the direct slices; its CPU over the whole run is the gateway slices'.
      const cpuBefore = cpuMs(opts.serverPid);
      const ticksBefore = machineTicks();
      const { direct, via, loopDelay, mockLoopDelay, mockCpuMs, schedule, viaMs } = await measureAlternating(
        { url: `${mockUrl}/v1/chat/completions`, headers: { 'content-type': 'application/json', authorization: 'Bearer x' } },
        { url: forwardUrl, headers: forwardHeaders, serverUrl: opts.serverUrl, serverPid: opts.serverPid },
        body,
        connections,
        opts.seconds,
        opts.mock,
      );
      await waitForSettlements(storage, merchantId);
      const cpuPerRequest = (cpuMs(opts.serverPid) - cpuBefore) / Math.max(1, via.ok);
      const ratio = via.perSecond / Math.max(1, direct.perSecond);
      const label = `forward ${stream ? 'streaming' : 'non-streaming'} chat, ${connections} connection${connections > 1 ? 's' : ''}`;
      const result =
        `added p50 ${(via.p50 - direct.p50).toFixed(2)} ms, p99 ${(via.p99 - direct.p99).toFixed(2)} ms; ` +
        `event-loop delay p50 ${loopDelay.p50.toFixed(2)} ms, p99 ${loopDelay.p99.toFixed(2)} ms, max ${loopDelay.max.toFixed(1)} ms ` +
        `(${loopContext(schedule, viaMs, via.ok, mockLoopDelay)}); ` +
        `${via.perSecond.toFixed(0)} req/s vs direct ${direct.perSecond.toFixed(0)} (${(ratio * 100).toFixed(1)} %); ` +
        `gateway CPU ${cpuPerRequest.toFixed(3)} ms/request (settlements included)${hostReference(mockCpuMs, direct, cpuPerRequest)}; ${via.non2xx} non-2xx; RSS now ${rssMb(opts.serverPid).toFixed(0)} MB; ` +
        `host steal ${stealPercent(ticksBefore).toFixed(1)} %`;
      console.log(`${label}: ${result}`);
      rows.push({
        scenario: label,
        engine: opts.engine,
        result,
        target: connections === 1 ? 'added p50 ≤ 0.5 ms, added p99 ≤ 3 ms' : '≥ 20 % of direct, ≤ 0.25 ms CPU/request, event-loop delay p99 ≤ 2 ms',
      });
      if (connections > 1) {
        const paced = await measurePaced(forwardUrl, forwardHeaders, stream, connections, Math.round(via.perSecond * PACED_SHARE), opts);
        await waitForSettlements(storage, merchantId);
        console.log(`${paced.scenario}: ${paced.result}`);
        rows.push(paced);
      }
    }
  }
  rows.push({
    scenario: 'gateway peak RSS (a server that served only the gateway scenarios)',
    engine: opts.engine,
    result: `${peakRssMb(opts.serverPid).toFixed(0)} MB`,
    target: '< 200 MB',
  });
  return rows;
}

// ---------------------------------------------------------------------------------------------
// Standalone: `node --import tsx bench/gateway.ts [--engine sqlite|postgres] [--seconds N]
// [--cpu-prof DIR]` runs only the gateway scenarios against a fresh server (and, with --cpu-prof,
// writes the server's V8 CPU profile to DIR when it exits). `--requests N` instead sends N
// requests per load (`--streams`, `--connections`, default 32) through the gateway alone and
// reports its CPU, system calls and bytes written per request: for A/B runs of two builds.
// BENCH_SERVER_NODE_ARGS adds node flags to the server alone (`--inspect`, a V8 heap flag),
// leaving the load generator and mock as they are.

async function standalone(): Promise<void> {
  const { openStorage } = await import('../src/storage/db.ts');
  const { migrateToLatest } = await import('../src/storage/migrate.ts');
  const { benchPostgresUrl, freshPostgresSchema, freshSqlite } = await import('./databases.ts');
  const arg = (name: string) => {
    const i = process.argv.indexOf(name);
    return i >= 0 ? process.argv[i + 1] : undefined;
  };
  const engine = arg('--engine') ?? 'sqlite';
  const seconds = Number(arg('--seconds') ?? 3);
  const profileDir = arg('--cpu-prof');
  const base = benchPostgresUrl();
  if (engine === 'postgres' && !base) throw new Error('set TEST_DATABASE_URL');
  const database = engine === 'postgres' ? await freshPostgresSchema(base!) : freshSqlite();
  const url = database.url;
  const mock = await startMock();
  process.env.BENCH_MOCK_URL = mock.url;
  const storage = openStorage(url, { poolSize: 4 });
  await migrateToLatest(storage);
  const port = 20_000 + Math.floor(Math.random() * 2000);
  const nodeArgs = [...(profileDir ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : []), ...(process.env.BENCH_SERVER_NODE_ARGS?.split(' ').filter(Boolean) ?? [])];
  const server = spawn('node', [...nodeArgs, 'bin/tollgate.js', 'serve'], {
    env: {
      ...process.env,
      DATABASE_URL: url,
      PORT: String(port),
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_MINUTE: '100000000',
      UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': mock.url }),
      PROVIDER_KEYS: JSON.stringify({ openai: 'sk-bench' }),
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const serverUrl = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${serverUrl}/readyz`)).ok) break;
    } catch {
      if (i > 100 || server.exitCode !== null) {
        mock.process.kill();
        throw new Error('server did not start');
      }
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  try {
    const list = (name: string) => arg(name)?.split(',');
    const requests = arg('--requests');
    if (requests) {
      for (const stream of list('--streams')?.map((v) => v === 'true') ?? [false, true]) {
        for (const connections of list('--connections')?.map(Number) ?? [32]) {
          console.log(await measureFixedCount({ storage, serverUrl, serverPid: server.pid!, requests: Number(requests), connections, stream }));
        }
      }
      return;
    }
    const rows = await benchGateway({
      engine,
      storage,
      serverUrl,
      serverPid: server.pid!,
      mock,
      seconds,
      connections: list('--connections')?.map(Number),
      streams: list('--streams')?.map((v) => v === 'true'),
    });
    for (const row of rows) console.log(`| ${row.scenario} | ${row.engine} | ${row.result} | ${row.target} |`);
  } finally {
    const exited = new Promise((r) => server.once('exit', r));
    server.kill('SIGTERM');
    await exited;
    mock.process.kill('SIGTERM');
    await storage.close();
    await database.drop();
  }
}

if (process.argv[1] && import.meta.url === (await import('node:url')).pathToFileURL(process.argv[1]).href) await standalone();
