/**
 * Anthropic Messages responses, errors and event streams, read into and written from the
 * canonical shape. Anthropic's `input_tokens` excludes prompt-cache reads and writes; the canonical
 * count includes them (the UsageReport convention), so they are taken out and put back here.
 * A stream whose provider reports usage only at its end (OpenAI) starts with zero input tokens in
 * `message_start`; the final counts come in `message_delta`, which Anthropic's clients read.
 */
import {
  isObject,
  sseEvent,
  streamEventObject,
  type ChatResponse,
  type ErrorKind,
  type JsonObject,
  type ProviderError,
  type ResponsePart,
  type StopReason,
  type StreamDecoder,
  type StreamEncoder,
  type StreamEvent,
  type Usage,
} from './canonical.ts';

const STOP_READ: Record<string, StopReason> = {
  end_turn: 'end',
  pause_turn: 'end',
  max_tokens: 'max_tokens',
  stop_sequence: 'stop_sequence',
  tool_use: 'tool_calls',
  refusal: 'content_filter',
};
const STOP_WRITE: Record<StopReason, string> = {
  end: 'end_turn',
  max_tokens: 'max_tokens',
  stop_sequence: 'stop_sequence',
  tool_calls: 'tool_use',
  content_filter: 'refusal',
};

const count = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) ? value : 0);

function readUsage(usage: unknown): Usage {
  if (!isObject(usage)) return { inputTokens: 0, outputTokens: 0 };
  const cached = count(usage.cache_read_input_tokens);
  const written = count(usage.cache_creation_input_tokens);
  const result: Usage = { inputTokens: count(usage.input_tokens) + cached + written, outputTokens: count(usage.output_tokens) };
  if (cached > 0) result.cachedInputTokens = cached;
  if (written > 0) result.cacheWriteInputTokens = written;
  return result;
}

function writeUsage(usage: Usage): JsonObject {
  const cached = usage.cachedInputTokens ?? 0;
  const written = usage.cacheWriteInputTokens ?? 0;
  const result: JsonObject = { input_tokens: usage.inputTokens - cached - written, output_tokens: usage.outputTokens };
  if (usage.cachedInputTokens !== undefined) result.cache_read_input_tokens = cached;
  if (usage.cacheWriteInputTokens !== undefined) result.cache_creation_input_tokens = written;
  return result;
}

export function readAnthropicResponse(body: JsonObject): ChatResponse {
  const parts: ResponsePart[] = [];
  for (const block of Array.isArray(body.content) ? body.content : []) {
    if (!isObject(block)) continue;
    if (block.type === 'text' && typeof block.text === 'string') parts.push({ type: 'text', text: block.text });
    if (block.type === 'tool_use') {
      parts.push({ type: 'tool_call', call: { id: String(block.id ?? ''), name: String(block.name ?? ''), arguments: isObject(block.input) ? block.input : {} } });
    }
  }
  const response: ChatResponse = {
    id: String(body.id ?? ''),
    model: String(body.model ?? ''),
    parts,
    stopReason: STOP_READ[String(body.stop_reason)] ?? 'end',
    usage: readUsage(body.usage),
  };
  if (typeof body.stop_sequence === 'string') response.stopSequence = body.stop_sequence;
  return response;
}

export function writeAnthropicResponse(response: ChatResponse): JsonObject {
  return {
    id: response.id,
    type: 'message',
    role: 'assistant',
    model: response.model,
    content: response.parts.map((part) =>
      part.type === 'text'
        ? { type: 'text', text: part.text }
        : { type: 'tool_use', id: part.call.id, name: part.call.name, input: part.call.arguments },
    ),
    stop_reason: STOP_WRITE[response.stopReason],
    stop_sequence: response.stopSequence ?? null,
    usage: writeUsage(response.usage),
  };
}

const ERROR_TYPES: Record<ErrorKind, string> = {
  invalid_request: 'invalid_request_error',
  authentication: 'authentication_error',
  permission: 'permission_error',
  not_found: 'not_found_error',
  rate_limit: 'rate_limit_error',
  overloaded: 'overloaded_error',
  server: 'api_error',
};

export function writeAnthropicError(error: ProviderError): JsonObject {
  return { type: 'error', error: { type: ERROR_TYPES[error.kind], message: error.message } };
}

/** Reads Anthropic's stream events; content blocks that are tool uses are numbered as tool calls. */
export function createAnthropicStreamDecoder(): StreamDecoder {
  let rawUsage: JsonObject = {};
  const toolIndexOfBlock = new Map<number, number>();
  const push = (data: string): StreamEvent[] => {
    const event = streamEventObject(data);
    if (!event) return [];
    switch (event.type) {
      case 'message_start': {
        const message = isObject(event.message) ? event.message : {};
        if (isObject(message.usage)) rawUsage = { ...message.usage };
        return [{ type: 'start', id: String(message.id ?? ''), model: String(message.model ?? '') }];
      }
      case 'content_block_start': {
        const block = isObject(event.content_block) ? event.content_block : {};
        if (block.type === 'text' && typeof block.text === 'string' && block.text !== '') return [{ type: 'text', text: block.text }];
        if (block.type !== 'tool_use') return [];
        const index = toolIndexOfBlock.size;
        toolIndexOfBlock.set(count(event.index), index);
        return [{ type: 'tool_call', index, id: String(block.id ?? ''), name: String(block.name ?? ''), argumentsDelta: '' }];
      }
      case 'content_block_delta': {
        const delta = isObject(event.delta) ? event.delta : {};
        if (delta.type === 'text_delta' && typeof delta.text === 'string') return [{ type: 'text', text: delta.text }];
        const index = toolIndexOfBlock.get(count(event.index));
        if (delta.type === 'input_json_delta' && index !== undefined) return [{ type: 'tool_call', index, argumentsDelta: String(delta.partial_json ?? '') }];
        return [];
      }
      case 'message_delta': {
        const delta = isObject(event.delta) ? event.delta : {};
        if (isObject(event.usage)) for (const [key, value] of Object.entries(event.usage)) if (value !== null) rawUsage[key] = value;
        const finish: StreamEvent = { type: 'finish', stopReason: STOP_READ[String(delta.stop_reason)] ?? 'end' };
        if (typeof delta.stop_sequence === 'string') finish.stopSequence = delta.stop_sequence;
        return [finish, { type: 'usage', usage: readUsage(rawUsage) }];
      }
      case 'message_stop':
        return [{ type: 'done' }];
      default:
        return [];
    }
  };
  return { push, end: () => [] };
}

/**
 * Writes Anthropic's stream events: one content block per run of text and per tool call, and the
 * stop reason held back until the usage that follows it, since `message_delta` carries both.
 */
export function createAnthropicStreamEncoder(): StreamEncoder {
  let block = -1;
  let open: 'text' | 'tool' | null = null;
  let finish: Extract<StreamEvent, { type: 'finish' }> | undefined;
  let usage: Usage = { inputTokens: 0, outputTokens: 0 };
  const emit = (type: string, data: JsonObject) => sseEvent({ type, ...data }, type);
  const close = (): string => {
    if (open === null) return '';
    open = null;
    return emit('content_block_stop', { index: block });
  };
  const openBlock = (kind: 'text' | 'tool', contentBlock: JsonObject): string => {
    const closed = close();
    block += 1;
    open = kind;
    return closed + emit('content_block_start', { index: block, content_block: contentBlock });
  };
  return (event) => {
    switch (event.type) {
      case 'start':
        return emit('message_start', {
          message: { id: event.id, type: 'message', role: 'assistant', model: event.model, content: [], stop_reason: null, stop_sequence: null, usage: writeUsage(usage) },
        });
      case 'text': {
        const opened = open === 'text' ? '' : openBlock('text', { type: 'text', text: '' });
        return opened + emit('content_block_delta', { index: block, delta: { type: 'text_delta', text: event.text } });
      }
      case 'tool_call': {
        const opened = event.id !== undefined || open !== 'tool' ? openBlock('tool', { type: 'tool_use', id: event.id ?? '', name: event.name ?? '', input: {} }) : '';
        if (event.argumentsDelta === '') return opened;
        return opened + emit('content_block_delta', { index: block, delta: { type: 'input_json_delta', partial_json: event.argumentsDelta } });
      }
      case 'finish':
        finish = event;
        return close();
      case 'usage':
        usage = event.usage;
        return '';
      case 'done': {
        const stop: { stopReason: StopReason; stopSequence?: string } = finish ?? { stopReason: 'end' };
        const delta = { stop_reason: STOP_WRITE[stop.stopReason], stop_sequence: stop.stopSequence ?? null };
        return close() + emit('message_delta', { delta, usage: writeUsage(usage) }) + emit('message_stop', {});
      }
    }
  };
}
