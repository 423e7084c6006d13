import type { SseEvent } from '../providers/types.ts';

/**
 * Passes a server-sent-event stream through event by event, dropping the events `drop` selects.
 * Used only when the gateway asked the provider for a usage event the client did not ask for:
 * every other stream is relayed as raw bytes, untouched.
 *
 * Each complete event (up to its blank line) is forwarded as soon as its last byte arrives, with
 * its original bytes; only an incomplete tail waits for the next chunk.
 */
export function createSseEventFilter(drop: (event: SseEvent) => boolean) {
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
      if (!drop(parseEvent(raw))) out += raw;
    }
    if (flushAll && pending) {
      if (!drop(parseEvent(pending))) out += pending;
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
