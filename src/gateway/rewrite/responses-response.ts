/**
 * OpenAI Responses API answers written from the canonical shape, JSON and streamed, for a client
 * of the Responses API whose provider speaks another format.
 *
 * The answer is a `response` object whose `output` holds one `message` item (its text as an
 * `output_text` part) and one `function_call` item per tool call. A stop at the output cap or by
 * a content filter is `status: "incomplete"` with its reason, as OpenAI reports it; any other
 * stop is `completed`. A stream sends OpenAI's events in OpenAI's order — `response.created`,
 * `response.in_progress`, then per item `response.output_item.added`, its content events
 * (`response.output_text.delta`, `response.function_call_arguments.delta`, …) and
 * `response.output_item.done`, and last `response.completed` (or `response.incomplete`) with the
 * whole response and its usage, which therefore waits for the provider's usage.
 */
import { sseEvent, type ChatResponse, type JsonObject, type ResponseContext, type StopReason, type StreamEncoder, type ToolCall, type Usage } from './canonical.ts';

type Outcome = { status: 'completed' | 'incomplete'; incomplete_details: { reason: string } | null };

function outcomeOf(stopReason: StopReason): Outcome {
  if (stopReason === 'max_tokens') return { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } };
  if (stopReason === 'content_filter') return { status: 'incomplete', incomplete_details: { reason: 'content_filter' } };
  return { status: 'completed', incomplete_details: null };
}

function writeUsage(usage: Usage): JsonObject {
  return {
    input_tokens: usage.inputTokens,
    input_tokens_details: { cached_tokens: usage.cachedInputTokens ?? 0 },
    output_tokens: usage.outputTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: usage.inputTokens + usage.outputTokens,
  };
}

const textPart = (text: string): JsonObject => ({ type: 'output_text', text, annotations: [] });

function messageItem(id: string, text: string | null, done: boolean): JsonObject {
  return { id, type: 'message', status: done ? 'completed' : 'in_progress', role: 'assistant', content: text === null ? [] : [textPart(text)] };
}

function callItem(id: string, call: Pick<ToolCall, 'id' | 'name'>, args: string, done: boolean): JsonObject {
  return { id, type: 'function_call', status: done ? 'completed' : 'in_progress', call_id: call.id, name: call.name, arguments: args };
}

type ResponseFields = { id: string; model: string; created: number };

function responseObject(fields: ResponseFields, outcome: Outcome | null, output: JsonObject[], usage: Usage | null): JsonObject {
  return {
    id: fields.id,
    object: 'response',
    created_at: fields.created,
    status: outcome?.status ?? 'in_progress',
    error: null,
    incomplete_details: outcome?.incomplete_details ?? null,
    model: fields.model,
    output,
    parallel_tool_calls: true,
    usage: usage ? writeUsage(usage) : null,
  };
}

export function writeResponsesResponse(response: ChatResponse, ctx: ResponseContext): JsonObject {
  const output: JsonObject[] = [];
  const text = response.parts.map((p) => (p.type === 'text' ? p.text : '')).join('');
  if (text !== '') output.push(messageItem(`msg_${response.id}`, text, true));
  for (const part of response.parts) {
    if (part.type === 'tool_call') output.push(callItem(`fc_${part.call.id}`, part.call, JSON.stringify(part.call.arguments), true));
  }
  return responseObject({ id: response.id, model: response.model, created: ctx.created }, outcomeOf(response.stopReason), output, response.usage);
}

/** An output item being streamed: the open message, or a tool call collecting its arguments. */
type OpenItem = { kind: 'message'; id: string; text: string } | { kind: 'call'; id: string; index: number; call: Pick<ToolCall, 'id' | 'name'>; args: string };

export function createResponsesStreamEncoder(ctx: ResponseContext): StreamEncoder {
  const fields: ResponseFields = { id: '', model: '', created: ctx.created };
  const output: JsonObject[] = [];
  let open: OpenItem | null = null;
  let sequence = 0;
  let stopReason: StopReason = 'end';
  let usage: Usage | null = null;

  const emit = (type: string, data: JsonObject): string => sseEvent({ type, sequence_number: sequence++, ...data }, type);
  const at = (item: OpenItem) => ({ item_id: item.id, output_index: output.length });

  const openItem = (item: OpenItem): string => {
    const added = item.kind === 'message' ? messageItem(item.id, null, false) : callItem(item.id, item.call, '', false);
    open = item;
    const text = emit('response.output_item.added', { output_index: output.length, item: added });
    return item.kind === 'message' ? text + emit('response.content_part.added', { ...at(item), content_index: 0, part: textPart('') }) : text;
  };

  const closeItem = (): string => {
    const item = open;
    if (!item) return '';
    open = null;
    let text: string;
    let done: JsonObject;
    if (item.kind === 'message') {
      done = messageItem(item.id, item.text, true);
      text =
        emit('response.output_text.done', { ...at(item), content_index: 0, text: item.text }) +
        emit('response.content_part.done', { ...at(item), content_index: 0, part: textPart(item.text) });
    } else {
      done = callItem(item.id, item.call, item.args, true);
      text = emit('response.function_call_arguments.done', { ...at(item), arguments: item.args });
    }
    text += emit('response.output_item.done', { output_index: output.length, item: done });
    output.push(done);
    return text;
  };

  return (event) => {
    switch (event.type) {
      case 'start': {
        fields.id = event.id;
        fields.model = event.model;
        const response = responseObject(fields, null, [], null);
        return emit('response.created', { response }) + emit('response.in_progress', { response });
      }
      case 'text': {
        let text = '';
        if (open?.kind !== 'message') text += closeItem() + openItem({ kind: 'message', id: `msg_${fields.id}`, text: '' });
        const item = open as unknown as Extract<OpenItem, { kind: 'message' }>;
        item.text += event.text;
        return text + emit('response.output_text.delta', { ...at(item), content_index: 0, delta: event.text });
      }
      case 'tool_call': {
        let text = '';
        const current = open as OpenItem | null;
        if (current?.kind !== 'call' || current.index !== event.index) {
          const call = { id: event.id ?? '', name: event.name ?? '' };
          text += closeItem() + openItem({ kind: 'call', id: `fc_${call.id}`, index: event.index, call, args: '' });
        }
        const item = open as unknown as Extract<OpenItem, { kind: 'call' }>;
        if (event.argumentsDelta === '') return text;
        item.args += event.argumentsDelta;
        return text + emit('response.function_call_arguments.delta', { ...at(item), delta: event.argumentsDelta });
      }
      case 'finish':
        stopReason = event.stopReason;
        return '';
      case 'usage':
        usage = event.usage;
        return '';
      case 'done': {
        const text = closeItem();
        const outcome = outcomeOf(stopReason);
        const response = responseObject(fields, outcome, output, usage ?? { inputTokens: 0, outputTokens: 0 });
        return text + emit(outcome.status === 'completed' ? 'response.completed' : 'response.incomplete', { response });
      }
    }
  };
}
