import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { REWRITE_FORMATS, type ChatResponse, type JsonObject, type ResponsePart, type StreamEvent } from '../../src/gateway/rewrite/canonical.ts';
import { CODECS, createStreamTranslator, translateResponseBody } from '../../src/gateway/rewrite/translate.ts';

/**
 * A Responses API client gets the same answer streamed as not: for any provider answer, the
 * `response` of the stream's last event (translated from the provider's stream, cut into any
 * chunks) equals the JSON answer translated from the provider's JSON, and the stream's deltas add
 * up to its items. So usage, status, text and tool calls cannot drift between the two writers.
 */

const CTX = { created: 1_700_000_000 };
const word = fc.stringMatching(/^[a-z]{1,8}( [a-z]{1,8}){0,3}$/);
const name = fc.stringMatching(/^[a-z][a-z_]{0,11}$/);
const args = fc.dictionary(name, fc.oneof(fc.integer(), word, fc.boolean()), { maxKeys: 3 });

function responseArb(): fc.Arbitrary<ChatResponse> {
  return fc
    .record({
      id: name,
      model: name,
      text: fc.option(word, { nil: undefined }),
      calls: fc.array(fc.record({ name, arguments: args }), { maxLength: 2 }),
      plainStop: fc.constantFrom('end' as const, 'max_tokens' as const, 'content_filter' as const),
      input: fc.integer({ min: 1, max: 100_000 }),
      cached: fc.option(fc.integer({ min: 1, max: 1_000 }), { nil: undefined }),
      output: fc.integer({ min: 0, max: 100_000 }),
    })
    .map((r) => {
      const parts: ResponsePart[] = r.text === undefined ? [] : [{ type: 'text', text: r.text }];
      r.calls.forEach((c, i) => parts.push({ type: 'tool_call', call: { id: `call_${r.id}_${i}`, name: c.name, arguments: c.arguments } }));
      const usage = { inputTokens: r.input + (r.cached ?? 0), outputTokens: r.output, ...(r.cached === undefined ? {} : { cachedInputTokens: r.cached }) };
      return { id: r.id, model: r.model, parts, stopReason: r.calls.length > 0 ? 'tool_calls' : r.plainStop, usage };
    });
}

/** The canonical events of a whole response: text in word pieces, arguments in halves. */
function eventsOf(response: ChatResponse): StreamEvent[] {
  const events: StreamEvent[] = [{ type: 'start', id: response.id, model: response.model }];
  let calls = 0;
  for (const part of response.parts) {
    if (part.type === 'text') for (const piece of part.text.split(/(?= )/)) events.push({ type: 'text', text: piece });
    if (part.type === 'tool_call') {
      const json = JSON.stringify(part.call.arguments);
      const index = calls++;
      events.push({ type: 'tool_call', index, id: part.call.id, name: part.call.name, argumentsDelta: json.slice(0, json.length >> 1) });
      events.push({ type: 'tool_call', index, argumentsDelta: json.slice(json.length >> 1) });
    }
  }
  events.push({ type: 'finish', stopReason: response.stopReason }, { type: 'usage', usage: response.usage }, { type: 'done' });
  return events;
}

function parseEvents(sse: string): JsonObject[] {
  return sse
    .split('\n\n')
    .flatMap((block) => block.split('\n').filter((line) => line.startsWith('data: ')))
    .map((line) => JSON.parse(line.slice(6)) as JsonObject);
}

/** The items as the deltas built them, by output index. */
function itemsFromDeltas(events: JsonObject[]): unknown[] {
  const items: { type: string; text: string }[] = [];
  for (const event of events) {
    const index = event.output_index as number;
    if (event.type === 'response.output_item.added') items[index] = { type: (event.item as JsonObject).type as string, text: '' };
    if (event.type === 'response.output_text.delta' || event.type === 'response.function_call_arguments.delta') items[index]!.text += event.delta as string;
  }
  return items;
}

describe('a Responses client: streamed and JSON answers agree', () => {
  it.each(REWRITE_FORMATS)('from a %s provider, whatever the chunking', (provider) => {
    fc.assert(
      fc.property(responseArb(), fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }), (response, cuts) => {
        const providerSse = eventsOf(response).map(CODECS[provider].streamEncoder({ ...CTX, includeUsage: true })).join('');
        const translator = createStreamTranslator(provider, 'responses', { ...CTX, includeUsage: false });
        let clientSse = '';
        let at = 0;
        for (const cut of cuts) {
          clientSse += translator.push(providerSse.slice(at, at + cut));
          at += cut;
        }
        clientSse += translator.push(providerSse.slice(at)) + translator.end();
        const events = parseEvents(clientSse);
        const json = translateResponseBody(provider, 'responses', 200, CODECS[provider].writeResponse(response, CTX), CTX);

        expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
        const last = events.at(-1)!;
        expect(last.type).toBe(json.status === 'completed' ? 'response.completed' : 'response.incomplete');
        expect(last.response).toEqual(json);
        const output = json.output as JsonObject[];
        expect(itemsFromDeltas(events)).toEqual(
          output.map((item) => ({ type: item.type, text: item.type === 'message' ? ((item.content as JsonObject[])[0]!.text as string) : (item.arguments as string) })),
        );
      }),
      { numRuns: 100 },
    );
  });
});
