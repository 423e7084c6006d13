/**
 * The one source of "now" for everything that decides by time: hold and lease expiry, spend-key
 * expiry and cycles, token buckets, caches' lifetimes. The app takes it as a dependency
 * (AppDeps.clock), so a test moves time forward instead of waiting for it.
 */
export type Clock = {
  /** Milliseconds since the Unix epoch. */
  now(): number;
};

export const systemClock: Clock = { now: () => Date.now() };

/** The clock's current instant as a Date. */
export const dateOf = (clock: Clock): Date => new Date(clock.now());
