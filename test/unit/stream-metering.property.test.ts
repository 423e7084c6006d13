import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createSseEventFilter, parseSseEvent, parseSseEventLines } from '../../src/gateway/sse-filter.ts';
import { findProvider, type MeterContext, type StreamUsage } from '../../src/providers/index.ts';
import { meterEventData, stripNullUsage } from '../../src/providers/openai-compatible.ts';
import { createSseMeter, createSseReader } from '../../src/providers/sse.ts';

/**
 * The OpenAI stream meter puts chunks without usage aside unparsed and drops them when a usage
 * chunk overrides them; the relay's event filter splits text without a regular expression in the
 * usual case. Both must give exactly what the plain, event-by-event way gives, for any stream and
 * any way the network splits it.
 */

const URL_ = new URL('https://api.openai.com/v1/chat/completions');
const ctx: MeterContext = { url: URL_, now: Date.now(), requestBody: { model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'Hi there' }] } };
const openai = findProvider(URL_)!;
const NOW_S = Math.floor(Date.now() / 1000);

const text = fc.string({ unit: fc.constantFrom('a', 'é', ' ', '🌍', '"', '\\', 'usage', 'type', '\n'), maxLength: 12 });
const created = fc.constantFrom<number | undefined>(NOW_S, NOW_S + 1, 1, undefined);
const usage = fc.oneof(
  fc.constant<unknown>(null),
  fc.constant<unknown>(undefined),
  fc.record(
    { prompt_tokens: fc.nat(50), completion_tokens: fc.nat(50), prompt_tokens_details: fc.record({ cached_tokens: fc.nat(50) }) },
    { requiredKeys: [] },
  ),
);

/** One event's data: chat chunks in their variants, a typed event, [DONE], or garbage. */
const eventData = fc.oneof(
  { weight: 8, arbitrary: fc.record({ id: fc.constantFrom('c1', 'c2', undefined), model: fc.constantFrom('gpt-4o', '', undefined), created, content: text, usage, groq: fc.boolean() }).map(chatChunk) },
  { weight: 1, arbitrary: text.map((delta) => JSON.stringify({ type: 'response.output_text.delta', delta })) },
  { weight: 1, arbitrary: fc.constantFrom('[DONE]', 'not json', '{"choices":[', '  {"id":"c1","choices":[]}') },
);

function chatChunk(c: { id?: string; model?: string; created?: number; content: string; usage: unknown; groq: boolean }): string {
  const chunk: Record<string, unknown> = { id: c.id, object: 'chat.completion.chunk', created: c.created, model: c.model };
  chunk.choices = c.usage && typeof c.usage === 'object' ? [] : [{ index: 0, delta: { content: c.content } }];
  if (c.groq && c.usage && typeof c.usage === 'object') chunk.x_groq = { usage: c.usage };
  else if (c.usage !== undefined) chunk.usage = c.usage;
  return JSON.stringify(chunk);
}

/** Cuts a text at the given fractions of its length (a network's chunking). */
function splitAt(whole: string, cuts: number[]): string[] {
  const points = [...new Set(cuts.map((f) => Math.floor(f * whole.length)))].sort((a, b) => a - b);
  const pieces: string[] = [];
  let from = 0;
  for (const p of points) {
    pieces.push(whole.slice(from, p));
    from = p;
  }
  pieces.push(whole.slice(from));
  return pieces;
}

function meterWith(meter: { push(chunk: string | Uint8Array): void; finish(): StreamUsage }, pieces: string[], asBytes: boolean): StreamUsage {
  for (const piece of pieces) meter.push(asBytes ? Buffer.from(piece) : piece);
  return meter.finish();
}

/** A stream of those events as the network delivers it: split anywhere, and sometimes cut inside its last event. */
const splitStream = fc
  .tuple(fc.array(eventData, { maxLength: 30 }), fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 6 }), fc.boolean())
  .map(([events, cuts, cutShort]) => {
    const whole = events.map((data) => `data: ${data}\n\n`).join('');
    return splitAt(cutShort && whole.length > 3 ? whole.slice(0, whole.length - 3) : whole, cuts);
  });

const eventByEvent = () => createSseMeter(ctx, (event, tally) => meterEventData(event.data, tally), 'gpt-4o');

describe('OpenAI stream meter', () => {
  it('meters any stream, split anywhere, exactly as metering every event on arrival does', () => {
    fc.assert(
      fc.property(splitStream, fc.boolean(), (pieces, asBytes) => {
        expect(meterWith(openai.createStreamMeter(ctx), pieces, asBytes)).toEqual(meterWith(eventByEvent(), pieces, asBytes));
      }),
      { numRuns: 400 },
    );
  });

  it('puts at most a mebibyte of events aside: a long stream without usage is metered as it goes, and still exactly', () => {
    const first = chatChunk({ id: 'c1', model: 'gpt-4o', created: NOW_S, content: 'start', usage: null, groq: false });
    const long = chatChunk({ id: 'c1', model: 'gpt-4o', created: NOW_S, content: 'x'.repeat(10_000), usage: null, groq: false });
    const last = chatChunk({ id: 'c1', model: 'gpt-4o', created: NOW_S, content: '', usage: { prompt_tokens: 3 }, groq: false });
    const stream = [first, ...Array.from({ length: 250 }, () => long), last].map((d) => `data: ${d}\n\n`).join('');
    const usage = meterWith(openai.createStreamMeter(ctx), [stream], false);
    expect(usage).toEqual(meterWith(eventByEvent(), [stream], false));
    expect(usage).toMatchObject({ inputTokens: 3, outputTokens: 0, estimated: false });
  });
});

describe('OpenAI stream meter fed whole events (the rewrite proxy shares its reader)', () => {
  /** The rewrite proxy's way: one reader splits the stream, the meter is given its events. */
  const meterByEvents = (meter: ReturnType<typeof openai.createStreamMeter>, pieces: string[], asBytes: boolean): StreamUsage => {
    const reader = createSseReader((event) => meter.pushEvent!(event));
    for (const piece of pieces) reader.push(asBytes ? Buffer.from(piece) : piece);
    reader.end();
    return meter.finish();
  };

  it('meters a stream, split anywhere and cut short or not, exactly as when it reads the bytes', () => {
    fc.assert(
      fc.property(splitStream, fc.boolean(), (pieces, asBytes) => {
        expect(meterByEvents(openai.createStreamMeter(ctx), pieces, asBytes)).toEqual(meterWith(openai.createStreamMeter(ctx), pieces, asBytes));
      }),
      { numRuns: 200 },
    );
  });
});

/**
 * The events of a stream as the event-stream format cuts them, read line end by line end (CRLF, LF
 * or a lone CR): an event ends with the line end that follows another. A CR that ends the text may
 * be half of a CRLF, so what it ends is left for the tail. The reference the filter is held to.
 */
function referenceEvents(whole: string, flushTail: boolean): string[] {
  const events: string[] = [];
  let start = 0;
  let afterLineEnd = false;
  for (let i = 0; i < whole.length; ) {
    const c = whole[i];
    if (c !== '\r' && c !== '\n') {
      afterLineEnd = false;
      i++;
      continue;
    }
    if (c === '\r' && i + 1 === whole.length) break;
    i += c === '\r' && whole[i + 1] === '\n' ? 2 : 1;
    if (afterLineEnd) {
      events.push(whole.slice(start, i));
      start = i;
    }
    afterLineEnd = !afterLineEnd;
  }
  if (flushTail && start < whole.length) events.push(whole.slice(start));
  return events;
}

describe('SSE event filter', () => {
  const line = fc.oneof(
    fc.string({ unit: fc.constantFrom('a', '{', '}', ':', ' ', 'é'), maxLength: 8 }).map((s) => `data: ${s}`),
    fc.string({ unit: fc.constantFrom('a', 'b'), maxLength: 4 }).map((s) => `data:${s}`),
    fc.constantFrom('event: ping', ': comment', 'id: 7', 'data: {"usage":null}', 'data: {"a":1,"usage":null}'),
  );
  const anEvent = fc.tuple(fc.array(line, { minLength: 1, maxLength: 3 }), fc.constantFrom('\n', '\r\n', '\r'), fc.constantFrom('\n', '\r\n', '\r'));

  it('hands every event over whole, with its own bytes, however the stream is split', () => {
    fc.assert(
      fc.property(fc.array(anEvent, { maxLength: 12 }), fc.string({ unit: fc.constantFrom('a', '\n', '\r'), maxLength: 3 }), fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 6 }), (events, tail, cuts) => {
        const whole = events.map(([lines, eol, blank]) => lines.join(eol) + eol + blank).join('') + tail;
        const seen: { raw: string; event: unknown }[] = [];
        const filter = createSseEventFilter((event, raw) => {
          seen.push({ raw, event });
          return raw;
        });
        let out = '';
        for (const piece of splitAt(whole, cuts)) out += filter.push(piece);
        out += filter.end();
        expect(out).toBe(whole);
        const expected = referenceEvents(whole, true);
        expect(seen.map((s) => s.raw)).toEqual(expected);
        expect(seen.map((s) => s.event)).toEqual(expected.map(parseSseEventLines));
      }),
      { numRuns: 400 },
    );
  });

  it('parses a one-line event and its general form alike', () => {
    for (const raw of ['data: {"a":1}\n\n', 'data: \n\n', 'data:x\n\n', 'data: x\r\n\r\n', 'data: x\n\r\n', 'event: e\ndata: y\n\n', 'data: x', 'data: a\rdata: b\n\n', 'data: x\r\r']) {
      expect(parseSseEvent(raw)).toEqual(parseSseEventLines(raw));
    }
  });

  it("cuts OpenAI's trailing null usage out of a one-line event as out of any other", () => {
    const raw = 'data: {"id":"a","choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n';
    expect(stripNullUsage(raw)).toBe('data: {"id":"a","choices":[{"delta":{"content":"hi"}}]}\n\n');
    expect(stripNullUsage(raw.replace('\n\n', '\r\n\r\n'))).toBe('data: {"id":"a","choices":[{"delta":{"content":"hi"}}]}\r\n\r\n');
    expect(stripNullUsage(`event: x\n${raw}`)).toBe('event: x\ndata: {"id":"a","choices":[{"delta":{"content":"hi"}}]}\n\n');
    expect(stripNullUsage(`event: x\r${raw.replace('\n\n', '\r\r')}`)).toBe('event: x\rdata: {"id":"a","choices":[{"delta":{"content":"hi"}}]}\r\r');
  });
});
