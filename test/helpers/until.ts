import { vi } from 'vitest';

export type UntilOptions = {
  /** How long to keep asking before failing (default 5 s): every wait is bounded, never just by the test's timeout. */
  timeoutMs?: number;
  /** How long between two asks (default 10 ms). */
  intervalMs?: number;
};

const NOT_YET = new Error('not yet');

/**
 * The suite's one way to wait for something another part does in the background (a settlement
 * written after the answer, a connection reaching a server, a row a worker inserts): asks `check`
 * again every few milliseconds (vi.waitFor) until it gives a value other than `undefined` or
 * `false`, and returns that value. After `timeoutMs` it fails naming `what` (a function when the
 * name needs the last answer). An error `check` throws fails the wait at once: it is an answer,
 * not a "not yet". It waits for an event, never for time to pass: a test that needs time to pass
 * moves the app's TestClock instead.
 */
export async function until<T>(check: () => T | undefined | false | Promise<T | undefined | false>, what: string | (() => string), opts: UntilOptions = {}): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 5_000;
  let outcome: { value: T } | { error: unknown } | undefined;
  try {
    await vi.waitFor(
      async () => {
        try {
          const value = await check();
          if (value === undefined || value === false) throw NOT_YET;
          outcome = { value };
        } catch (error) {
          if (error === NOT_YET) throw error;
          outcome = { error };
        }
      },
      { timeout: timeoutMs, interval: opts.intervalMs ?? 10 },
    );
  } catch {
    throw new Error(`waited ${timeoutMs} ms for ${typeof what === 'string' ? what : what()}`);
  }
  if (!outcome) throw new Error(`waited for ${typeof what === 'string' ? what : what()}: no answer`);
  if ('error' in outcome) throw outcome.error;
  return outcome.value;
}
