import type { SseEvent } from '../providers/types.ts';

/**
 * Passes a server-sent-event stream through event by event: `keep` returns the text to forward
 * for an event (its raw text, or a rewritten one), or null to drop it.
 * Used only when the gateway asked the provider for a usage event the client did not ask for:
 * every other stream is relayed as raw bytes, untouched.
 *
 * Each complete event (up to its blank line) is forwarded as soon as its last byte arrives, with
 * its original bytes; only an incomplete tail waits for the next chunk.
 */
export function createSseEventFilter(keep: (event: SseEvent, raw: string) => string | null) {
  const decoder = new TextDecoder();
  let pending = '';

  const emitComplete = (flushAll: boolean): string => {
    let out = '';
    for (;;) {
      const boundary = /\r?\n\r?\n/.exec(pending);
      if (!boundary) break;
      const end = boundary.index + boundary[0].length;
      const raw = pending.slice(0, end);
      pending = pending.slice(end);
      out += keep(parseEvent(raw), raw) ?? '';
    }
    if (flushAll && pending) {
      out += keep(parseEvent(pending), pending) ?? '';
      pending = '';
    }
    return out;
  };

  return {
    /** Returns the text to forward for this chunk (possibly empty). */
    push(chunk: Uint8Array): string {
      pending += decoder.decode(chunk, { stream: true });
      return emitComplete(false);
    },
    /** Returns whatever was left when the stream ended. */
    end(): string {
      pending += decoder.decode();
      return emitComplete(true);
    },
  };
}

function parseEvent(raw: string): SseEvent {
  const data: string[] = [];
  let event: string | undefined;
  for (const line of raw.split(/\r?\n/)) {
    if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
    else if (line.startsWith('event:')) event = line.slice(6).trim();
  }
  return { event, data: data.join('\n') };
}
