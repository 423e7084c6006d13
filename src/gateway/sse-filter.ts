import type { SseEvent } from '../providers/types.ts';

/**
 * Passes a server-sent-event stream through event by event: `keep` returns the text to forward
 * for an event (its raw text, or a rewritten one), or null to drop it.
 * Used only when the gateway asked the provider for a usage event the client did not ask for:
 * every other stream is relayed as raw bytes, untouched.
 *
 * Each complete event (up to its blank line) is forwarded as soon as its last byte arrives, with
 * its original bytes; only an incomplete tail waits for the next chunk. The filter takes text:
 * the relay decodes each chunk once and hands the same text to the stream meter.
 */
export function createSseEventFilter(keep: (event: SseEvent, raw: string) => string | null) {
  let pending = '';

  const emitComplete = (flushAll: boolean): string => {
    let out = '';
    let from = 0;
    // The first carriage return at or after `from`, looked up again only once passed.
    let cr = pending.indexOf('\r');
    for (;;) {
      if (cr >= 0 && cr < from) cr = pending.indexOf('\r', from);
      const end = eventEnd(pending, from, cr);
      if (end < 0) break;
      const raw = pending.slice(from, end);
      out += keep(parseSseEvent(raw, cr >= 0 && cr < end), raw) ?? '';
      from = end;
    }
    pending = from === 0 ? pending : pending.slice(from);
    if (flushAll && pending) {
      out += keep(parseSseEvent(pending), pending) ?? '';
      pending = '';
    }
    return out;
  };

  return {
    /** Returns the text to forward for this piece of the stream (possibly empty). */
    push(text: string): string {
      pending += text;
      return emitComplete(false);
    },
    /** Returns whatever was left when the stream ended. */
    end(): string {
      return emitComplete(true);
    },
  };
}

/** Two line ends in a row: each CRLF, LF or a lone CR, as the event-stream format allows. */
const BLANK_LINE = /(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)/g;

/**
 * Where the first event at or after `from` ends (just past its blank line); -1 when none has yet.
 * `cr`: the first carriage return at or after `from`, -1 for none.
 */
function eventEnd(text: string, from: number, cr: number): number {
  // The usual case first: events separated by "\n\n" with no carriage return before the boundary.
  const lf = text.indexOf('\n\n', from);
  if (cr < 0) return lf < 0 ? -1 : lf + 2;
  if (lf >= 0 && lf < cr) return lf + 2;
  BLANK_LINE.lastIndex = from;
  const boundary = BLANK_LINE.exec(text);
  if (!boundary) return -1;
  const end = boundary.index + boundary[0].length;
  // A carriage return that ends the text so far may be the first half of a CRLF still to come.
  return end === text.length && text.charCodeAt(end - 1) === 0x0d ? -1 : end;
}

/**
 * The `event` and `data` fields of one raw event (up to and including its blank line).
 * `hasCarriageReturn`: whether the event holds a CR, when the caller knows already.
 */
export function parseSseEvent(raw: string, hasCarriageReturn = raw.includes('\r')): SseEvent {
  // One `data: …` line ended by "\n\n", as nearly every provider sends: no split needed.
  if (!hasCarriageReturn && raw.startsWith('data: ') && raw.indexOf('\n') === raw.length - 2) {
    return { event: undefined, data: raw.slice(6, raw.length - 2) };
  }
  return parseSseEventLines(raw);
}

/** The same, line by line: any event, its lines ended by CRLF, LF or a lone CR. */
export function parseSseEventLines(raw: string): SseEvent {
  const data: string[] = [];
  let event: string | undefined;
  for (const line of raw.split(/\r\n|\r|\n/)) {
    if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
    else if (line.startsWith('event:')) event = line.slice(6).trim();
  }
  return { event, data: data.join('\n') };
}
