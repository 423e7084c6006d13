import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { addIntervals, nextCycleEnd, type BillingInterval } from '../../src/domain/billing-cycle.ts';

const intervals: BillingInterval[] = ['day', 'week', 'month', 'year'];
const anchors = fc.date({ min: new Date('2000-01-01T00:00:00Z'), max: new Date('2090-01-01T00:00:00Z'), noInvalidDate: true });

describe('billing cycles', () => {
  it('monthly cycles keep the anchor day, clamped to shorter months', () => {
    const anchor = new Date('2026-01-31T10:30:00.000Z');
    expect([1, 2, 3, 4].map((n) => addIntervals(anchor, 'month', n).toISOString())).toEqual([
      '2026-02-28T10:30:00.000Z',
      '2026-03-31T10:30:00.000Z',
      '2026-04-30T10:30:00.000Z',
      '2026-05-31T10:30:00.000Z',
    ]);
    expect(addIntervals(new Date('2024-02-29T00:00:00Z'), 'year', 1).toISOString()).toBe('2025-02-28T00:00:00.000Z');
  });

  it('the next cycle end is the first boundary strictly after the given time', () => {
    fc.assert(
      fc.property(anchors, fc.constantFrom(...intervals), fc.integer({ min: 0, max: 400 * 86_400_000 }), (anchor, interval, offset) => {
        const after = new Date(anchor.getTime() + offset);
        const end = nextCycleEnd(anchor, interval, after);
        expect(end.getTime()).toBeGreaterThan(after.getTime());
        // It is a boundary, and the one before it is not after `after` (or is the anchor's first).
        const boundaries = Array.from({ length: 500 }, (_, i) => addIntervals(anchor, interval, i + 1).getTime());
        const index = boundaries.indexOf(end.getTime());
        expect(index).toBeGreaterThanOrEqual(0);
        if (index > 0) expect(boundaries[index - 1]!).toBeLessThanOrEqual(after.getTime());
      }),
      { numRuns: 300 },
    );
  });

  it('boundaries only ever move forward', () => {
    fc.assert(
      fc.property(anchors, fc.constantFrom(...intervals), fc.integer({ min: 1, max: 200 }), (anchor, interval, n) => {
        expect(addIntervals(anchor, interval, n).getTime()).toBeGreaterThan(addIntervals(anchor, interval, n - 1).getTime());
      }),
    );
  });
});
