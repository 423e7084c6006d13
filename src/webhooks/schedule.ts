/**
 * When a failed delivery is tried again: after the first attempt (made at once), about 5 s, 5 min,
 * 30 min, 2 h, 5 h, 10 h and 10 h later; after the eighth attempt the delivery is `failed`.
 */
export const RETRY_DELAYS_MS = [5_000, 5 * 60_000, 30 * 60_000, 2 * 3_600_000, 5 * 3_600_000, 10 * 3_600_000, 10 * 3_600_000] as const;

export const MAX_ATTEMPTS = RETRY_DELAYS_MS.length + 1;

/** Each delay is spread by up to this fraction either way, so retries of many deliveries do not arrive together. */
export const JITTER = 0.1;

/** An endpoint whose deliveries have all failed for this long is disabled. */
export const DISABLE_AFTER_FAILING_MS = 5 * 24 * 3_600_000;

/**
 * The wait before the next attempt of a delivery that has failed `attemptsMade` times, or null
 * when it has had all its attempts. `random` is uniform in [0, 1).
 */
export function retryDelayMs(attemptsMade: number, random: () => number): number | null {
  if (attemptsMade < 1 || attemptsMade >= MAX_ATTEMPTS) return null;
  const base = RETRY_DELAYS_MS[attemptsMade - 1]!;
  return Math.round(base * (1 + JITTER * (2 * random() - 1)));
}

/** Whether a failure at `nowMs` ends an endpoint's run of failures that began at `failingSinceMs`. */
export function shouldDisable(failingSinceMs: number, nowMs: number): boolean {
  return nowMs - failingSinceMs >= DISABLE_AFTER_FAILING_MS;
}
