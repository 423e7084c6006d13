import type { Clock } from '../../src/domain/clock.ts';

/**
 * Real time plus an offset the test moves: time still passes on its own (timers, round trips),
 * and `advance` jumps past a TTL or a refill without waiting for it.
 */
export class TestClock implements Clock {
  #offsetMs = 0;

  now(): number {
    return Date.now() + this.#offsetMs;
  }

  advance(ms: number): void {
    if (ms < 0) throw new RangeError('a clock only moves forward');
    this.#offsetMs += ms;
  }
}
