import { html, type SafeHtml } from '../html.ts';

const DAY_MS = 86_400_000;
/** The days a page shows when the query names none: the last 30, today included. */
const DEFAULT_DAYS = 30;

/** A range of whole UTC days, both ends included, as the date inputs write them (YYYY-MM-DD). */
export type DayRange = { from: string; to: string };

const isDate = (v: string | undefined): v is string => typeof v === 'string' && /^\d{4}-\d{2}-\d{2}$/.test(v);
const dayOf = (ms: number) => new Date(ms).toISOString().slice(0, 10);

/** The query's days, each end that is missing or malformed replaced by the default range's. */
export function dayRangeOf(q: { from?: string; to?: string }, now: number): DayRange {
  return { to: isDate(q.to) ? q.to : dayOf(now), from: isDate(q.from) ? q.from : dayOf(now - (DEFAULT_DAYS - 1) * DAY_MS) };
}

/** The same days as instants: the first one's midnight, and the midnight after the last one. */
export function instantsOf(r: DayRange): { from: string; before: string } {
  return { from: `${r.from}T00:00:00.000Z`, before: `${dayOf(Date.parse(`${r.to}T00:00:00Z`) + DAY_MS)}T00:00:00.000Z` };
}

/** The filter form's "From (UTC)" and "To (UTC)" date fields, their ids prefixed so a page's labels stay unique. */
export function dayRangeFields(idPrefix: string, r: DayRange): SafeHtml {
  return html`<div><label for="${idPrefix}-from">From (UTC)</label><input id="${idPrefix}-from" name="from" type="date" value="${r.from}"></div>
<div><label for="${idPrefix}-to">To (UTC)</label><input id="${idPrefix}-to" name="to" type="date" value="${r.to}"></div>`;
}
