// Why was the server's event loop late? A preload for the server alone, by hand:
//
//   BENCH_SERVER_NODE_ARGS="--import ./bench/loop-lag.mjs" node --import tsx bench/gateway.ts --connections 1
//
// A 5 ms interval timer notes every time it fires more than 1.5 ms late, with what the main thread
// did over that interval (/proc/thread-self/schedstat: time on a CPU, and time runnable but waiting
// for one) and whether a garbage collection overlapped it. At exit it prints, per size of delay,
// how many late timers there were and where their time went. A loop late while its thread ran is
// late because of work in the process (long synchronous work, GC); a loop late while its thread
// waited for a CPU is late because the host had none free (other processes, or this one's other
// threads). The first LOOP_LAG_SKIP_S seconds (default 10: start-up, migrations, the bench's
// set-up) are left out. Plain JavaScript: the server runs from dist/ without a TypeScript loader.
import { readFileSync } from 'node:fs';
import { PerformanceObserver, performance } from 'node:perf_hooks';
import { isMainThread } from 'node:worker_threads';

const INTERVAL_MS = 5;
const LATE_MS = 1.5;
const BUCKETS_MS = [1.5, 2, 3, 5, 10, 20, Infinity];
const GC_KINDS = { 1: 'scavenge', 2: 'minor mark-compact', 4: 'mark-compact', 8: 'incremental', 16: 'weak callbacks' };

if (isMainThread) {
  const skipUntil = performance.now() + Number(process.env.LOOP_LAG_SKIP_S ?? 10) * 1000;
  /** The main thread's time on a CPU and waiting for one so far, in ms (it is the thread this runs on). */
  const schedule = () => {
    const [run, wait] = readFileSync('/proc/thread-self/schedstat', 'utf8').split(' ').map(Number);
    return { run: run / 1e6, wait: wait / 1e6 };
  };
  const late = [];
  const gcs = [];
  let previous = performance.now();
  let previousSchedule = schedule();
  setInterval(() => {
    const now = performance.now();
    const current = schedule();
    const lateMs = now - previous - INTERVAL_MS;
    if (lateMs > LATE_MS && now > skipUntil) {
      late.push({ from: previous, to: now, lateMs, runMs: current.run - previousSchedule.run, waitMs: current.wait - previousSchedule.wait });
    }
    previous = now;
    previousSchedule = current;
  }, INTERVAL_MS).unref();
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) if (entry.startTime > skipUntil) gcs.push({ start: entry.startTime, ms: entry.duration, kind: entry.detail?.kind });
  }).observe({ entryTypes: ['gc'] });

  process.on('exit', () => {
    const lines = [`loop-lag (pid ${process.pid}): timers late by more than ${LATE_MS} ms, every ${INTERVAL_MS} ms`];
    const overlapsGc = (w) => gcs.some((gc) => gc.start < w.to && gc.start + gc.ms > w.from - INTERVAL_MS);
    for (let i = 0; i < BUCKETS_MS.length - 1; i++) {
      const inBucket = late.filter((w) => w.lateMs >= BUCKETS_MS[i] && w.lateMs < BUCKETS_MS[i + 1]);
      if (inBucket.length === 0) continue;
      const mean = (pick) => (inBucket.reduce((total, w) => total + pick(w), 0) / inBucket.length).toFixed(1);
      const waitedLittle = inBucket.filter((w) => w.waitMs < 0.5).length;
      lines.push(
        `  late ${BUCKETS_MS[i]}–${BUCKETS_MS[i + 1]} ms: ${inBucket.length}; over each interval (${INTERVAL_MS} ms + the delay) the loop's thread ` +
          `ran ${mean((w) => w.runMs)} ms and waited for a CPU ${mean((w) => w.waitMs)} ms on average; ` +
          `${waitedLittle} waited under 0.5 ms; ${inBucket.filter(overlapsGc).length} overlap a GC`,
      );
    }
    const byKind = new Map();
    for (const gc of gcs) byKind.set(gc.kind, [...(byKind.get(gc.kind) ?? []), gc.ms]);
    for (const [kind, pauses] of byKind) {
      pauses.sort((a, b) => a - b);
      const at = (q) => pauses[Math.min(pauses.length - 1, Math.floor(q * pauses.length))].toFixed(2);
      lines.push(`  GC ${GC_KINDS[kind] ?? kind}: ${pauses.length}, pause p50 ${at(0.5)} ms, p90 ${at(0.9)} ms, max ${at(1)} ms`);
    }
    process.stderr.write(`${lines.join('\n')}\n`);
  });
}
