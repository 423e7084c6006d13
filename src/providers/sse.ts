import { createParser } from 'eventsource-parser';
import { createUsageTally, type UsageTally } from './usage.ts';
import type { MeterContext, SseEvent, StreamMeter } from './types.ts';

/**
 * Largest single event we are willing to buffer. Responses-API `response.completed` events repeat
 * the whole output, so this is generous; past it the meter stops parsing (and reports the stream
 * as incomplete) instead of letting one response grow the process without bound.
 */
const MAX_EVENT_CHARACTERS = 32 * 1024 * 1024;

export type SseReader = {
  push(chunk: string | Uint8Array): void;
  /** Flushes a last event that lacked its closing blank line. */
  end(): void;
};

/** Turns arbitrarily split chunks (bytes or text) into whole server-sent events. */
export function createSseReader(onEvent: (event: SseEvent) => void): SseReader {
  // stream: true keeps a multi-byte character split across two chunks intact.
  const decoder = new TextDecoder();
  let overflowed = false;
  const parser = createParser({
    onEvent,
    onError: (error) => {
      if (error.type === 'max-buffer-size-exceeded') overflowed = true;
    },
    maxBufferSize: MAX_EVENT_CHARACTERS,
  });
  const feed = (text: string): void => {
    if (!overflowed && text) parser.feed(text);
  };
  return {
    push(chunk) {
      feed(typeof chunk === 'string' ? decoder.decode() + chunk : decoder.decode(chunk, { stream: true }));
    },
    end() {
      feed(`${decoder.decode()}\n\n`);
    },
  };
}

/**
 * A stream meter made of an SSE reader and a usage tally; `onEvent` is the family's quirks.
 * `fallbackModel` (from the request or URL) names the model when no event did. `beforeResult`
 * runs once the stream is over, before the tally is read (a family that put events aside).
 */
export function createSseMeter(
  ctx: MeterContext,
  onEvent: (event: SseEvent, tally: UsageTally) => void,
  fallbackModel: string | null,
  beforeResult?: (tally: UsageTally) => void,
): StreamMeter {
  const tally = createUsageTally(ctx);
  const reader = createSseReader((event) => onEvent(event, tally));
  let finished = false;
  return {
    push(chunk) {
      if (!finished) reader.push(chunk);
    },
    pushEvent(event) {
      if (!finished) onEvent(event, tally);
    },
    finish() {
      if (!finished) {
        reader.end();
        beforeResult?.(tally);
      }
      finished = true;
      const usage = tally.result();
      if (usage.model === undefined && fallbackModel) usage.model = fallbackModel;
      return usage;
    },
  };
}
