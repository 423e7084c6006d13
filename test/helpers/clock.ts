import type { Clock } from '../../src/domain/clock.ts';

/**
 * A clock that stands still until the test moves it: `advance` jumps past a TTL or a refill,
 * `set` puts it at a given instant. Nothing expires, refills or ages while a test waits on a round
 * trip, so an expiry 150 ms ahead is as safe as one a day ahead. It starts at the wall clock's
 * now (so rows it stamps sort beside rows a database stamps) unless given a start.
 */
export class TestClock implements Clock {
  #nowMs: number;

  constructor(startMs: number = Date.now()) {
    this.#nowMs = startMs;
  }

  now(): number {
    return this.#nowMs;
  }

  advance(ms: number): void {
    if (ms < 0) throw new RangeError('a clock only moves forward');
    this.#nowMs += ms;
  }

  /** Puts the clock at `ms` (forward only, like time). */
  set(ms: number): void {
    this.advance(ms - this.#nowMs);
  }
}
