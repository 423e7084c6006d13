/**
 * OpenAI Chat Completions responses, errors and `chat.completion.chunk` streams, read into and
 * written from the canonical shape. OpenAI does not say which stop sequence ended a completion:
 * `stop_sequence` is written as `stop`.
 */
import {
  isObject,
  streamEventObject,
  type ChatResponse,
  type ErrorKind,
  type JsonObject,
  type ProviderError,
  type ResponsePart,
  type StopReason,
  type StreamEvent,
  type Usage,
  sseEvent,
  type ResponseContext,
  type StreamDecoder,
  type StreamEncoder,
} from './canonical.ts';

const FINISH_READ: Record<string, StopReason> = {
  stop: 'end',
  length: 'max_tokens',
  tool_calls: 'tool_calls',
  function_call: 'tool_calls',
  content_filter: 'content_filter',
};
const FINISH_WRITE: Record<StopReason, string> = {
  end: 'stop',
  stop_sequence: 'stop',
  max_tokens: 'length',
  tool_calls: 'tool_calls',
  content_filter: 'content_filter',
};

export function readOpenAIResponse(body: JsonObject): ChatResponse {
  const choice = Array.isArray(body.choices) && isObject(body.choices[0]) ? body.choices[0] : {};
  const message = isObject(choice.message) ? choice.message : {};
  const parts: ResponsePart[] = [];
  if (typeof message.content === 'string' && message.content !== '') parts.push({ type: 'text', text: message.content });
  if (Array.isArray(message.tool_calls)) {
    for (const call of message.tool_calls) {
      if (!isObject(call) || !isObject(call.function)) continue;
      parts.push({ type: 'tool_call', call: { id: String(call.id ?? ''), name: String(call.function.name ?? ''), arguments: parseObject(call.function.arguments) } });
    }
  }
  return {
    id: String(body.id ?? ''),
    model: String(body.model ?? ''),
    parts,
    stopReason: FINISH_READ[String(choice.finish_reason)] ?? 'end',
    usage: readUsage(body.usage),
  };
}

function parseObject(text: unknown): JsonObject {
  if (typeof text !== 'string') return {};
  try {
    const parsed: unknown = JSON.parse(text);
    return isObject(parsed) ? parsed : {};
  } catch {
    return {};
  }
}

function readUsage(usage: unknown): Usage {
  if (!isObject(usage)) return { inputTokens: 0, outputTokens: 0 };
  const result: Usage = { inputTokens: count(usage.prompt_tokens), outputTokens: count(usage.completion_tokens) };
  const details = isObject(usage.prompt_tokens_details) ? usage.prompt_tokens_details : {};
  if (typeof details.cached_tokens === 'number' && details.cached_tokens > 0) result.cachedInputTokens = details.cached_tokens;
  return result;
}

const count = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) ? value : 0);

function writeUsage(usage: Usage): JsonObject {
  const written: JsonObject = {
    prompt_tokens: usage.inputTokens,
    completion_tokens: usage.outputTokens,
    total_tokens: usage.inputTokens + usage.outputTokens,
  };
  if (usage.cachedInputTokens !== undefined) written.prompt_tokens_details = { cached_tokens: usage.cachedInputTokens };
  return written;
}

export function writeOpenAIResponse(response: ChatResponse, ctx: ResponseContext): JsonObject {
  const text = response.parts.map((p) => (p.type === 'text' ? p.text : '')).join('');
  const calls = response.parts.flatMap((p) => (p.type === 'tool_call' ? [p.call] : []));
  const message: JsonObject = { role: 'assistant', content: text === '' && calls.length > 0 ? null : text, refusal: null };
  if (calls.length > 0) {
    message.tool_calls = calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: JSON.stringify(c.arguments) } }));
  }
  return {
    id: response.id,
    object: 'chat.completion',
    created: ctx.created,
    model: response.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: FINISH_WRITE[response.stopReason] }],
    usage: writeUsage(response.usage),
  };
}

const ERROR_TYPES: Record<ErrorKind, string> = {
  invalid_request: 'invalid_request_error',
  authentication: 'authentication_error',
  permission: 'permission_error',
  not_found: 'not_found_error',
  rate_limit: 'rate_limit_error',
  overloaded: 'server_error',
  server: 'server_error',
};

export function writeOpenAIError(error: ProviderError): JsonObject {
  return { error: { message: error.message, type: ERROR_TYPES[error.kind], param: null, code: null } };
}

/** Reads `chat.completion.chunk` events; the first chunk names the response. */
export function createOpenAIStreamDecoder(): StreamDecoder {
  let started = false;
  const push = (data: string): StreamEvent[] => {
    if (data.trim() === '[DONE]') return [{ type: 'done' }];
    const chunk = streamEventObject(data);
    if (!chunk) return [];
    const events: StreamEvent[] = [];
    if (!started) {
      started = true;
      events.push({ type: 'start', id: String(chunk.id ?? ''), model: String(chunk.model ?? '') });
    }
    const choice = Array.isArray(chunk.choices) && isObject(chunk.choices[0]) ? chunk.choices[0] : undefined;
    const delta = choice && isObject(choice.delta) ? choice.delta : {};
    if (typeof delta.content === 'string' && delta.content !== '') events.push({ type: 'text', text: delta.content });
    if (Array.isArray(delta.tool_calls)) {
      for (const call of delta.tool_calls) if (isObject(call)) events.push(toolCallEvent(call));
    }
    if (choice && typeof choice.finish_reason === 'string') events.push({ type: 'finish', stopReason: FINISH_READ[choice.finish_reason] ?? 'end' });
    if (isObject(chunk.usage)) events.push({ type: 'usage', usage: readUsage(chunk.usage) });
    return events;
  };
  return { push, end: () => [] };
}

function toolCallEvent(call: JsonObject): StreamEvent {
  const fn = isObject(call.function) ? call.function : {};
  const event: StreamEvent = { type: 'tool_call', index: count(call.index), argumentsDelta: typeof fn.arguments === 'string' ? fn.arguments : '' };
  if (typeof call.id === 'string') event.id = call.id;
  if (typeof fn.name === 'string') event.name = fn.name;
  return event;
}

/** Writes `chat.completion.chunk` events; the usage chunk only when the client asked for it. */
export function createOpenAIStreamEncoder(ctx: ResponseContext & { includeUsage: boolean }): StreamEncoder {
  let id = '';
  let model = '';
  const chunk = (choices: unknown[], extra?: JsonObject) =>
    sseEvent({ id, object: 'chat.completion.chunk', created: ctx.created, model, choices, ...extra });
  const delta = (d: JsonObject, finish: string | null = null) => chunk([{ index: 0, delta: d, logprobs: null, finish_reason: finish }]);
  return (event) => {
    switch (event.type) {
      case 'start':
        ({ id, model } = event);
        return delta({ role: 'assistant', content: '' });
      case 'text':
        return delta({ content: event.text });
      case 'tool_call': {
        const call: JsonObject = { index: event.index };
        if (event.id !== undefined) Object.assign(call, { id: event.id, type: 'function' });
        call.function = event.name !== undefined ? { name: event.name, arguments: event.argumentsDelta } : { arguments: event.argumentsDelta };
        return delta({ tool_calls: [call] });
      }
      case 'finish':
        return delta({}, FINISH_WRITE[event.stopReason]);
      case 'usage':
        return ctx.includeUsage ? chunk([], { usage: writeUsage(event.usage) }) : '';
      case 'done':
        return sseEvent('[DONE]');
    }
  };
}
