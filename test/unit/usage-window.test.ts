import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  DAY_MS,
  MAX_USAGE_DAYS,
  dayIndexOf,
  dayWindow,
  isRangeProblem,
  localDayOf,
  parseUsageTime,
  usageRange,
  type UsageRange,
  type UsageTime,
} from '../../src/domain/usage-window.ts';

const iso = (ms: number) => new Date(ms).toISOString();
const dayOf = (date: string) => Date.parse(`${date}T00:00:00Z`) / DAY_MS;

function parsed(text: string): UsageTime {
  const r = parseUsageTime(text);
  if (!r.ok) throw new Error(`${text}: ${r.message}`);
  return r.value;
}

function range(start: string, end?: string, now = new Date('2026-03-15T12:00:00Z')): UsageRange {
  const r = usageRange(parsed(start), end === undefined ? undefined : parsed(end), now);
  if (isRangeProblem(r)) throw new Error(`${r.path}: ${r.message}`);
  return r;
}

describe('parseUsageTime', () => {
  it('reads a plain date as midnight UTC', () => {
    expect(parsed('2026-03-01')).toEqual({ day: dayOf('2026-03-01'), offsetMinutes: 0, instantMs: Date.parse('2026-03-01T00:00:00Z'), hasTime: false });
  });

  it.each([
    ['2026-03-01T00:00:00Z', 0, '2026-03-01T00:00:00.000Z'],
    ['2026-03-01T00:00:00-05:00', -300, '2026-03-01T05:00:00.000Z'],
    ['2026-03-01T00:00:00+05:30', 330, '2026-02-28T18:30:00.000Z'],
    ['2026-03-01T10:15:00+05:45', 345, '2026-03-01T04:30:00.000Z'],
    ['2026-03-01T00:00:00-09:30', -570, '2026-03-01T09:30:00.000Z'],
    ['2026-03-01T00:00:00+12:45', 765, '2026-02-28T11:15:00.000Z'],
    ['2026-03-01T00:00:00+14:00', 840, '2026-02-28T10:00:00.000Z'],
    ['2026-03-01T00:00:00-14:00', -840, '2026-03-01T14:00:00.000Z'],
    ['2026-03-01T23:59:59.999-05:00', -300, '2026-03-02T04:59:59.999Z'],
    ['2026-03-01T23:59:59.5Z', 0, '2026-03-01T23:59:59.500Z'],
    ['2026-03-01T00:00-05:00', -300, '2026-03-01T05:00:00.000Z'],
    ['2026-03-01T00:00:00-0500', -300, '2026-03-01T05:00:00.000Z'],
    ['2026-03-01t00:00:00z', 0, '2026-03-01T00:00:00.000Z'],
    // `+05:30` sent unencoded in a query string arrives as ` 05:30`.
    ['2026-03-01T00:00:00 05:30', 330, '2026-02-28T18:30:00.000Z'],
  ])('reads %s as offset %i, instant %s', (text, offset, instant) => {
    const t = parsed(text);
    expect(t.offsetMinutes).toBe(offset);
    expect(iso(t.instantMs)).toBe(instant);
    expect(t.hasTime).toBe(true);
  });

  it('keeps the date as written: it is the local date in the given offset', () => {
    expect(parsed('2026-03-01T00:00:00+05:30').day).toBe(dayOf('2026-03-01'));
    expect(parsed('2026-03-01T23:00:00-05:00').day).toBe(dayOf('2026-03-01'));
  });

  it('reads -00:00 as UTC, never a negative zero', () => {
    expect(Object.is(parsed('2026-03-01T00:00:00-00:00').offsetMinutes, 0)).toBe(true);
  });

  it.each([
    ['', 'must be a date'],
    ['yesterday', 'must be a date'],
    ['2026-3-1', 'must be a date'],
    ['2026-03-01T00:00:00', 'must be a date'], // no offset: which day would be ambiguous
    ['2026-03-01 00:00:00Z', 'must be a date'],
    ['2026-02-30', 'not a calendar date'],
    ['2025-02-29', 'not a calendar date'],
    ['2026-13-01', 'not a calendar date'],
    ['2026-03-01T24:00:00Z', 'invalid time'],
    ['2026-03-01T12:60:00Z', 'invalid time'],
    ['2026-03-01T00:00:00+05:20', 'quarter hours'],
    ['2026-03-01T00:00:00+00:01', 'quarter hours'],
    ['2026-03-01T00:00:00+14:15', 'between -14:00 and +14:00'],
    ['2026-03-01T00:00:00-15:00', 'between -14:00 and +14:00'],
    ['2026-03-01T00:00:00+05:60', 'invalid UTC offset'],
    ['1969-12-31', 'between 1970'],
    ['9999-01-01', 'between 1970'],
  ])('refuses %j', (text, message) => {
    const r = parseUsageTime(text);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.message).toContain(message);
  });

  it('accepts a leap day', () => {
    expect(parsed('2024-02-29').day).toBe(dayOf('2024-02-29'));
  });
});

describe('dayWindow and localDayOf', () => {
  it.each([
    [0, '2026-03-01T00:00:00.000Z', '2026-03-02T00:00:00.000Z'],
    [-300, '2026-03-01T05:00:00.000Z', '2026-03-02T05:00:00.000Z'],
    [330, '2026-02-28T18:30:00.000Z', '2026-03-01T18:30:00.000Z'],
    [345, '2026-02-28T18:15:00.000Z', '2026-03-01T18:15:00.000Z'],
    [-570, '2026-03-01T09:30:00.000Z', '2026-03-02T09:30:00.000Z'],
  ])('at offset %i, 2026-03-01 is [%s, %s)', (offset, start, end) => {
    const w = dayWindow(dayOf('2026-03-01'), offset);
    expect(w).toEqual({ date: '2026-03-01', startMs: Date.parse(start), endMs: Date.parse(end) });
    expect(localDayOf(w.startMs, offset)).toBe(dayOf('2026-03-01'));
    expect(localDayOf(w.endMs - 1, offset)).toBe(dayOf('2026-03-01'));
    expect(localDayOf(w.endMs, offset)).toBe(dayOf('2026-03-02'));
    expect(localDayOf(w.startMs - 1, offset)).toBe(dayOf('2026-02-28'));
  });

  it('places an instant before 1970 on the right day too (floor, not truncation)', () => {
    expect(localDayOf(-1, 0)).toBe(-1);
  });
});

describe('usageRange', () => {
  it('covers whole days from the start date through the end date, inclusive, in start’s offset', () => {
    const r = range('2026-02-27T00:00:00-05:00', '2026-03-02');
    expect(r.offsetMinutes).toBe(-300);
    expect(r.days.map((d) => d.date)).toEqual(['2026-02-27', '2026-02-28', '2026-03-01', '2026-03-02']);
    expect(iso(r.startMs)).toBe('2026-02-27T05:00:00.000Z');
    expect(iso(r.endMs)).toBe('2026-03-03T05:00:00.000Z');
  });

  it('has contiguous 24-hour days', () => {
    const r = range('2024-02-27T00:00:00+05:30', '2024-03-02');
    expect(r.days.map((d) => d.date)).toEqual(['2024-02-27', '2024-02-28', '2024-02-29', '2024-03-01', '2024-03-02']);
    r.days.forEach((d, i) => {
      expect(d.endMs - d.startMs).toBe(DAY_MS);
      if (i > 0) expect(d.startMs).toBe(r.days[i - 1]!.endMs);
    });
  });

  it('reads a plain date start as UTC days', () => {
    const r = range('2026-03-01', '2026-03-01');
    expect(r.days).toEqual([{ date: '2026-03-01', startMs: Date.parse('2026-03-01T00:00:00Z'), endMs: Date.parse('2026-03-02T00:00:00Z') }]);
  });

  it('uses the time of day only to pick the date', () => {
    const r = range('2026-03-01T18:45:00-05:00', '2026-03-01T06:00:00-05:00');
    expect(r.days.map((d) => d.date)).toEqual(['2026-03-01']);
    expect(iso(r.startMs)).toBe('2026-03-01T05:00:00.000Z');
  });

  it('reads a date-time end as an instant and places it in start’s offset (the start offset rules)', () => {
    // 2026-03-10T00:30-04:00 is 2026-03-09T23:30 at -05:00: the last day is the 9th.
    expect(range('2026-03-08T00:00:00-05:00', '2026-03-10T00:30:00-04:00').days.map((d) => d.date)).toEqual(['2026-03-08', '2026-03-09']);
    // A plain-date end is a local date in start's offset.
    expect(range('2026-03-08T00:00:00-05:00', '2026-03-10').days.map((d) => d.date)).toEqual(['2026-03-08', '2026-03-09', '2026-03-10']);
  });

  it('runs to today in start’s offset when end is absent', () => {
    const now = new Date('2026-03-15T02:00:00Z');
    expect(range('2026-03-13T00:00:00-05:00', undefined, now).days.map((d) => d.date)).toEqual(['2026-03-13', '2026-03-14']);
    expect(range('2026-03-13T00:00:00+05:30', undefined, now).days.map((d) => d.date)).toEqual(['2026-03-13', '2026-03-14', '2026-03-15']);
  });

  it('refuses an end before start, a start after today, and more than a year of days', () => {
    const now = new Date('2026-03-15T12:00:00Z');
    expect(usageRange(parsed('2026-03-02'), parsed('2026-03-01'), now)).toEqual({ path: 'end', message: 'must not be before start' });
    expect(usageRange(parsed('2026-03-16'), undefined, now)).toMatchObject({ path: 'start' });
    expect(usageRange(parsed('2025-01-01'), parsed('2026-01-02'), now)).toMatchObject({ path: 'end', message: expect.stringContaining(`${MAX_USAGE_DAYS}`) });
    expect(range('2024-01-01', '2024-12-31').days).toHaveLength(MAX_USAGE_DAYS);
  });
});

describe('dayIndexOf', () => {
  it('is inclusive at a day’s start and exclusive at its end', () => {
    const r = range('2026-03-01T00:00:00+05:30', '2026-03-02');
    expect(dayIndexOf(r, r.startMs - 1)).toBeNull();
    expect(dayIndexOf(r, r.startMs)).toBe(0);
    expect(dayIndexOf(r, r.days[1]!.startMs - 1)).toBe(0);
    expect(dayIndexOf(r, r.days[1]!.startMs)).toBe(1);
    expect(dayIndexOf(r, r.endMs - 1)).toBe(1);
    expect(dayIndexOf(r, r.endMs)).toBeNull();
  });

  it('puts every 15-minute bucket wholly inside one local day at any quarter-hour offset', () => {
    const quarterHours = fc.integer({ min: -56, max: 56 });
    const bucket = fc.integer({ min: 0, max: 96 * 3 - 1 });
    fc.assert(
      fc.property(quarterHours, bucket, (q, b) => {
        const r = range(`2026-03-01T00:00:00${formatOffset(q * 15)}`, '2026-03-03');
        const startMs = r.startMs + b * 15 * 60_000;
        const first = dayIndexOf(r, startMs);
        expect(first).not.toBeNull();
        expect(dayIndexOf(r, startMs + 15 * 60_000 - 1)).toBe(first);
        expect(localDayOf(startMs, r.offsetMinutes) - localDayOf(r.startMs, r.offsetMinutes)).toBe(first);
      }),
    );
  });
});

function formatOffset(minutes: number): string {
  const abs = Math.abs(minutes);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${minutes < 0 ? '-' : '+'}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`;
}
