/**
 * What a process used so far, read from /proc: CPU time (its own, or every local PostgreSQL
 * process's), resident memory, how its threads were scheduled, its system calls, and the time the
 * host took back from this VM. The benchmarks difference two readings around a run.
 */
import { readdirSync, readFileSync } from 'node:fs';

const CLOCK_TICKS_PER_SECOND = 100;

/** A process's CPU time so far in milliseconds: in user mode, in the kernel (system calls), and both. */
export function cpuTimes(pid: number): { user: number; system: number } {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return { user: (Number(fields[11]) * 1000) / CLOCK_TICKS_PER_SECOND, system: (Number(fields[12]) * 1000) / CLOCK_TICKS_PER_SECOND };
}

/** utime + stime of a process, in milliseconds. */
export function cpuMs(pid: number): number {
  const { user, system } = cpuTimes(pid);
  return user + system;
}

/**
 * CPU time so far of this host's PostgreSQL, in milliseconds: every live `postgres` process, plus
 * what its exited backends used (the postmaster's cutime + cstime). Meaningful only while the
 * server under test runs its database on this host, as the bench does.
 */
export function localPostgresCpuMs(): number {
  let total = 0;
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      if (!stat.includes('(postgres)')) continue;
      const fields = stat.split(') ')[1]!.split(' ');
      // utime, stime, and cutime + cstime (children reaped already: only the postmaster has any).
      total += ((Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])) * 1000) / CLOCK_TICKS_PER_SECOND;
    } catch {
      // The process ended between the listing and the read.
    }
  }
  return total;
}

function statusMb(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8').split('\n').find((l) => l.startsWith(`${field}:`))!;
  return Number(line.replace(/\D+/g, '')) / 1024;
}

/** The machine's CPU ticks so far, in all and stolen by the host (this is a VM). */
export function machineTicks(): { total: number; steal: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number);
  return { total: fields.reduce((a, b) => a + b, 0), steal: fields[7] ?? 0 };
}

/** Percent of the machine's CPU time the host took back since `before`. */
export function stealPercent(before: { total: number; steal: number }): number {
  const now = machineTicks();
  return (100 * (now.steal - before.steal)) / Math.max(1, now.total - before.total);
}

export const peakRssMb = (pid: number) => statusMb(pid, 'VmHWM');
export const rssMb = (pid: number) => statusMb(pid, 'VmRSS');

/**
 * How a process's threads spent their time so far, in ms (`/proc/<pid>/task/<tid>/schedstat`, ns):
 * the main thread (the event loop) on a CPU and runnable but waiting for one, and every other
 * thread's time on a CPU (the SQLite writer, V8's garbage-collection helpers, libuv's pool). A
 * loop that is late while its thread waits for a CPU is late because the host is short of CPUs,
 * not because of work of its own.
 */
export function threadSchedule(pid: number): { mainRunMs: number; mainWaitMs: number; otherRunMs: number } {
  const schedstat = (tid: string) => {
    try {
      const [run, wait] = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ').map(Number);
      return { run: run! / 1e6, wait: wait! / 1e6 };
    } catch {
      return { run: 0, wait: 0 }; // the thread ended meanwhile
    }
  };
  const main = schedstat(String(pid));
  const others = readdirSync(`/proc/${pid}/task`).filter((tid) => tid !== String(pid));
  return { mainRunMs: main.run, mainWaitMs: main.wait, otherRunMs: others.reduce((total, tid) => total + schedstat(tid).run, 0) };
}

export type Schedule = ReturnType<typeof threadSchedule>;
export const scheduleSince = (pid: number, before: Schedule): Schedule => {
  const now = threadSchedule(pid);
  return { mainRunMs: now.mainRunMs - before.mainRunMs, mainWaitMs: now.mainWaitMs - before.mainWaitMs, otherRunMs: now.otherRunMs - before.otherRunMs };
};

/** Read and write system calls and bytes written by a process so far (`/proc/<pid>/io`). */
export function ioCounts(pid: number): { syscr: number; syscw: number; wchar: number } {
  const fields = Object.fromEntries(
    readFileSync(`/proc/${pid}/io`, 'utf8')
      .trim()
      .split('\n')
      .map((line) => line.split(': ') as [string, string]),
  );
  return { syscr: Number(fields.syscr), syscw: Number(fields.syscw), wchar: Number(fields.wchar) };
}
