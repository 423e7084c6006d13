import { describe, expect, it } from 'vitest';
import { cycleStart, cycleWindow, currentValue, retryAfterFor, takeToken, UNITS_PER_TOKEN } from '../../src/domain/spend-limits.ts';

describe('spend-limit cycles (UTC calendar)', () => {
  const at = new Date('2025-03-05T13:45:12.345Z'); // a Wednesday
  it('daily, weekly (Monday), monthly windows and total', () => {
    expect(cycleWindow('daily', at)).toEqual({ start: new Date('2025-03-05T00:00:00Z'), end: new Date('2025-03-06T00:00:00Z') });
    expect(cycleWindow('weekly', at)).toEqual({ start: new Date('2025-03-03T00:00:00Z'), end: new Date('2025-03-10T00:00:00Z') });
    expect(cycleWindow('monthly', at)).toEqual({ start: new Date('2025-03-01T00:00:00Z'), end: new Date('2025-04-01T00:00:00Z') });
    expect(cycleWindow('total', at)).toEqual({ start: new Date(0), end: null });
    // A Sunday belongs to the week that began the Monday before; December rolls into January.
    expect(cycleStart('weekly', new Date('2025-03-09T23:59:59.999Z'))).toBe('2025-03-03T00:00:00.000Z');
    expect(cycleWindow('monthly', new Date('2025-12-31T23:00:00Z')).end).toEqual(new Date('2026-01-01T00:00:00Z'));
  });
  it('a counter stamped with an older window reads as 0', () => {
    expect(currentValue(5n, '2025-03-05T00:00:00.000Z', 'daily', at)).toBe(5n);
    expect(currentValue(5n, '2025-03-04T00:00:00.000Z', 'daily', at)).toBe(0n);
    expect(currentValue(5n, new Date(0).toISOString(), null, at)).toBe(5n);
  });
});

describe('token bucket', () => {
  const spec = { rpm: 60, burst: 5 };
  it('allows the burst, then refills rpm per minute', () => {
    let units = spec.burst * UNITS_PER_TOKEN;
    let atMs = 0;
    let allowed = 0;
    for (let i = 0; i < 50; i++) {
      const d = takeToken(spec, units, atMs, 0);
      if (d.allowed) allowed++;
      units = d.units;
      atMs = d.atMs;
    }
    expect(allowed).toBe(5);
    expect(takeToken(spec, units, atMs, 999).allowed).toBe(false);
    expect(takeToken(spec, units, atMs, 1000).allowed).toBe(true);
    expect(takeToken(spec, units, atMs, 10 * 60_000).units).toBe(4 * UNITS_PER_TOKEN);
  });
  it('never refills on a clock that goes back, and says when the next token comes', () => {
    expect(takeToken(spec, 0, 5000, 1000)).toMatchObject({ allowed: false, units: 0, atMs: 5000 });
    expect(retryAfterFor(spec, 0)).toBe(1);
    expect(retryAfterFor({ rpm: 1, burst: 1 }, 0)).toBe(60);
  });
});
