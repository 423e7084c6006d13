import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DISABLE_AFTER_FAILING_MS, JITTER, MAX_ATTEMPTS, RETRY_DELAYS_MS, retryDelayMs, shouldDisable } from '../../src/webhooks/schedule.ts';

describe('webhook retry schedule', () => {
  it('is the documented one: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h after the immediate first attempt', () => {
    expect(RETRY_DELAYS_MS).toEqual([5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000]);
    expect(MAX_ATTEMPTS).toBe(8);
  });

  it('keeps every jittered delay within 10 % of its scheduled delay', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: MAX_ATTEMPTS - 1 }), fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }), (attempts, r) => {
        const delay = retryDelayMs(attempts, () => r)!;
        const base = RETRY_DELAYS_MS[attempts - 1]!;
        expect(delay).toBeGreaterThanOrEqual(Math.floor(base * (1 - JITTER)));
        expect(delay).toBeLessThanOrEqual(Math.ceil(base * (1 + JITTER)));
      }),
    );
  });

  it('keeps a whole run of retries within 10 % of the schedule, whatever the jitter of each', () => {
    const scheduled = RETRY_DELAYS_MS.reduce((a, b) => a + b, 0);
    fc.assert(
      fc.property(fc.array(fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }), { minLength: MAX_ATTEMPTS - 1, maxLength: MAX_ATTEMPTS - 1 }), (draws) => {
        const total = draws.reduce((sum, r, i) => sum + retryDelayMs(i + 1, () => r)!, 0);
        expect(Math.abs(total - scheduled)).toBeLessThanOrEqual(scheduled * JITTER + MAX_ATTEMPTS);
      }),
    );
  });

  it('has no attempt after the eighth, and none before the first', () => {
    expect(retryDelayMs(MAX_ATTEMPTS, () => 0.5)).toBeNull();
    expect(retryDelayMs(0, () => 0.5)).toBeNull();
  });

  it('disables an endpoint exactly when its failures have lasted 5 days', () => {
    expect(shouldDisable(0, DISABLE_AFTER_FAILING_MS - 1)).toBe(false);
    expect(shouldDisable(0, DISABLE_AFTER_FAILING_MS)).toBe(true);
  });
});
