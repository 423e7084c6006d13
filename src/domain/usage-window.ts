/**
 * Day windows for GET /usage: calendar days at a fixed UTC offset. Pure, no I/O.
 *
 * The caller names the timezone only by an offset (`-05:00`), never by a zone name, so there are
 * no daylight-saving changes: every local day lasts exactly 24 hours and starts at
 * `local midnight - offset`. Offsets are whole quarter hours, so a local day is always a whole
 * number of the 15-minute usage buckets.
 */

const MINUTE_MS = 60_000;
export const DAY_MS = 86_400_000;
const QUARTER_HOUR_MINUTES = 15;
/** The widest offsets in use anywhere (UTC-12 … UTC+14), rounded out symmetrically. */
const MAX_OFFSET_MINUTES = 14 * 60;
/** One year, leap day included: enough for any report, small enough to answer quickly. */
export const MAX_USAGE_DAYS = 366;
/** Dates outside these years are refused, so every instant renders as a plain ISO string. */
const MIN_YEAR = 1970;
const MAX_YEAR = 9998;

/** A time the caller wrote: its calendar date as written, the offset it was written in, its instant. */
export type UsageTime = {
  /** Days since 1970-01-01 of the date as written (the local date in `offsetMinutes`). */
  day: number;
  offsetMinutes: number;
  instantMs: number;
  /** False for a plain date (`YYYY-MM-DD`), which means midnight UTC. */
  hasTime: boolean;
};

/** One local calendar day: [startMs, endMs) in UTC instants. */
export type DayWindow = { date: string; startMs: number; endMs: number };

export type UsageRange = {
  offsetMinutes: number;
  days: DayWindow[];
  /** Start of the first day and end (exclusive) of the last one. */
  startMs: number;
  endMs: number;
};

export type Parsed<T> = { ok: true; value: T } | { ok: false; message: string };

const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;
// A space in the sign position is a `+` that a query string decoded as a space (`+05:30`
// sent unencoded): nothing else can stand there, so it is read back as `+`.
const DATE_TIME =
  /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?(?:([Zz])|([+\- ])(\d{2}):?(\d{2}))$/;

const fail = (message: string): { ok: false; message: string } => ({ ok: false, message });

/**
 * Reads `start` or `end` of GET /usage: a date (`2026-03-01`, meaning UTC) or a date-time with
 * an offset (`2026-03-01T00:00:00-05:00`, `…Z`). A date-time without an offset is refused: the
 * offset decides which day a request falls in, and guessing it would misplace money.
 */
export function parseUsageTime(text: string): Parsed<UsageTime> {
  const dateOnly = DATE.exec(text);
  if (dateOnly) {
    const day = dayFromParts(dateOnly[1]!, dateOnly[2]!, dateOnly[3]!);
    if (typeof day === 'string') return fail(day);
    return { ok: true, value: { day, offsetMinutes: 0, instantMs: day * DAY_MS, hasTime: false } };
  }
  const m = DATE_TIME.exec(text);
  if (!m) {
    return fail('must be a date (YYYY-MM-DD) or a date-time with an offset (YYYY-MM-DDTHH:MM:SS±HH:MM or …Z)');
  }
  const day = dayFromParts(m[1]!, m[2]!, m[3]!);
  if (typeof day === 'string') return fail(day);
  const [hours, minutes, seconds] = [Number(m[4]), Number(m[5]), Number(m[6] ?? '0')];
  if (hours > 23 || minutes > 59 || seconds > 59) return fail('has an invalid time of day');
  const offsetMinutes = m[8] ? 0 : offsetFromParts(m[9]!, m[10]!, m[11]!);
  if (typeof offsetMinutes === 'string') return fail(offsetMinutes);
  const millis = Number((m[7] ?? '').padEnd(3, '0').slice(0, 3));
  const wallClockMs = day * DAY_MS + (hours * 60 + minutes) * MINUTE_MS + seconds * 1000 + millis;
  return { ok: true, value: { day, offsetMinutes, instantMs: wallClockMs - offsetMinutes * MINUTE_MS, hasTime: true } };
}

/** Days since 1970-01-01, or the reason the date is not a real calendar date in range. */
function dayFromParts(year: string, month: string, day: string): number | string {
  const [y, mo, d] = [Number(year), Number(month), Number(day)];
  if (y < MIN_YEAR || y > MAX_YEAR) return `must be a date between ${MIN_YEAR} and ${MAX_YEAR}`;
  const ms = Date.UTC(y, mo - 1, d);
  const back = new Date(ms);
  // Date.UTC rolls 2026-02-30 over to March; a round trip catches every impossible date.
  if (back.getUTCFullYear() !== y || back.getUTCMonth() !== mo - 1 || back.getUTCDate() !== d) {
    return `${year}-${month}-${day} is not a calendar date`;
  }
  return ms / DAY_MS;
}

/** Signed offset in minutes, or the reason it is refused. */
function offsetFromParts(sign: string, hours: string, minutes: string): number | string {
  const [h, m] = [Number(hours), Number(minutes)];
  if (m > 59) return 'has an invalid UTC offset';
  const total = h * 60 + m;
  if (total > MAX_OFFSET_MINUTES) return 'UTC offset must be between -14:00 and +14:00';
  if (m % QUARTER_HOUR_MINUTES !== 0) return 'UTC offset must be a whole number of quarter hours (e.g. +05:30, +05:45)';
  // `-00:00` is UTC too; never hand out a negative zero.
  return sign === '-' && total > 0 ? -total : total;
}

/** The local calendar day (days since 1970-01-01) holding an instant, at an offset. */
export function localDayOf(instantMs: number, offsetMinutes: number): number {
  return Math.floor((instantMs + offsetMinutes * MINUTE_MS) / DAY_MS);
}

/** `YYYY-MM-DD` of a day number. */
function dateOfDay(day: number): string {
  return new Date(day * DAY_MS).toISOString().slice(0, 10);
}

/** The UTC instants bounding one local day: [start, next day's start). */
export function dayWindow(day: number, offsetMinutes: number): DayWindow {
  const startMs = day * DAY_MS - offsetMinutes * MINUTE_MS;
  return { date: dateOfDay(day), startMs, endMs: startMs + DAY_MS };
}

export type RangeProblem = { path: 'start' | 'end'; message: string };

/**
 * The days a usage report covers. `start`'s offset sets the timezone of every day; its date is
 * the first day. The last day is `end`'s date: as written for a plain date (read in `start`'s
 * offset), or the local date holding the instant for a date-time. Without `end`, today (in
 * `start`'s offset). Days are always whole: a time of day only selects a date.
 */
export function usageRange(start: UsageTime, end: UsageTime | undefined, now: Date): UsageRange | RangeProblem {
  const offsetMinutes = start.offsetMinutes;
  const firstDay = start.day;
  const lastDay = end ? lastDayOf(end, offsetMinutes) : localDayOf(now.getTime(), offsetMinutes);
  if (lastDay < firstDay) {
    return end
      ? { path: 'end', message: 'must not be before start' }
      : { path: 'start', message: 'is after today (end defaults to now)' };
  }
  if (lastDay - firstDay + 1 > MAX_USAGE_DAYS) {
    return { path: end ? 'end' : 'start', message: `a usage report covers at most ${MAX_USAGE_DAYS} days` };
  }
  const days: DayWindow[] = [];
  for (let day = firstDay; day <= lastDay; day++) days.push(dayWindow(day, offsetMinutes));
  return { offsetMinutes, days, startMs: days[0]!.startMs, endMs: days[days.length - 1]!.endMs };
}

function lastDayOf(end: UsageTime, offsetMinutes: number): number {
  return end.hasTime ? localDayOf(end.instantMs, offsetMinutes) : end.day;
}

export function isRangeProblem(r: UsageRange | RangeProblem): r is RangeProblem {
  return 'path' in r;
}

/** Index into `range.days` of the day holding an instant, or null outside the range. */
export function dayIndexOf(range: UsageRange, instantMs: number): number | null {
  if (instantMs < range.startMs || instantMs >= range.endMs) return null;
  return Math.floor((instantMs - range.startMs) / DAY_MS);
}
