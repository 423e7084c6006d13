/**
 * Spend-key limits, pure: cycle windows and token-bucket arithmetic.
 *
 * - Cycles follow UTC calendar boundaries: `daily` starts at 00:00 UTC, `weekly` on Monday 00:00
 *   UTC (ISO weeks), `monthly` on the 1st 00:00 UTC; `total` never resets (its window starts at
 *   the epoch).
 * - A token bucket holds `burst` tokens (default: `rpm`) and refills `rpm` tokens per minute. It is
 *   kept in integer units of 1/60000 token, so the refill is exactly `rpm` units per millisecond
 *   and no floating point is involved.
 */
export const CYCLES = ['daily', 'weekly', 'monthly', 'total'] as const;
export type Cycle = (typeof CYCLES)[number];

const DAY_MS = 86_400_000;

/** Start (inclusive) and end (exclusive; null for `total`) of the cycle window containing `now`. */
export function cycleWindow(cycle: Cycle, now: Date): { start: Date; end: Date | null } {
  const y = now.getUTCFullYear();
  const m = now.getUTCMonth();
  const d = now.getUTCDate();
  switch (cycle) {
    case 'daily': {
      const start = new Date(Date.UTC(y, m, d));
      return { start, end: new Date(start.getTime() + DAY_MS) };
    }
    case 'weekly': {
      const sinceMonday = (now.getUTCDay() + 6) % 7;
      const start = new Date(Date.UTC(y, m, d - sinceMonday));
      return { start, end: new Date(start.getTime() + 7 * DAY_MS) };
    }
    case 'monthly':
      return { start: new Date(Date.UTC(y, m, 1)), end: new Date(Date.UTC(y, m + 1, 1)) };
    case 'total':
      return { start: new Date(0), end: null };
  }
}

/** ISO start of the current window; counters stamped with another start belong to an older cycle. */
export function cycleStart(cycle: Cycle | null, now: Date): string {
  return cycleWindow(cycle ?? 'total', now).start.toISOString();
}

/** Whole seconds until the window ends (at least 1); null for `total`, which never resets. */
export function secondsUntilCycleEnd(cycle: Cycle, now: Date): number | null {
  const { end } = cycleWindow(cycle, now);
  return end === null ? null : Math.max(1, Math.ceil((end.getTime() - now.getTime()) / 1000));
}

/** A counter's value in the current window: a counter stamped with an older window counts as 0. */
export function currentValue(value: bigint, stampedStart: string, cycle: Cycle | null, now: Date): bigint {
  return stampedStart === cycleStart(cycle, now) ? value : 0n;
}

// ---------------------------------------------------------------------------------------------
// Token bucket

export const UNITS_PER_TOKEN = 60_000;

export type BucketSpec = { rpm: number; burst: number };

export const bucketCapacity = (spec: BucketSpec): number => spec.burst * UNITS_PER_TOKEN;

/** The bucket's level at `nowMs` after refilling from `units` at `atMs` (a clock going back refills nothing). */
export function refill(spec: BucketSpec, units: number, atMs: number, nowMs: number): number {
  const elapsed = Math.max(0, nowMs - atMs);
  return Math.min(bucketCapacity(spec), units + elapsed * spec.rpm);
}

export type BucketDecision = { allowed: boolean; units: number; atMs: number; retryAfterSeconds: number };

/** Takes one token if there is one; otherwise says how long until there will be. */
export function takeToken(spec: BucketSpec, units: number, atMs: number, nowMs: number): BucketDecision {
  const level = refill(spec, units, atMs, nowMs);
  const at = Math.max(atMs, nowMs);
  if (level >= UNITS_PER_TOKEN) return { allowed: true, units: level - UNITS_PER_TOKEN, atMs: at, retryAfterSeconds: 0 };
  return { allowed: false, units: level, atMs: at, retryAfterSeconds: retryAfterFor(spec, level) };
}

/** Seconds until a bucket at `level` holds one whole token (at least 1). */
export function retryAfterFor(spec: BucketSpec, level: number): number {
  const missing = UNITS_PER_TOKEN - level;
  return Math.max(1, Math.ceil(missing / spec.rpm / 1000));
}
