/**
 * Gemini generateContent responses, errors and `alt=sse` streams, read into and written from the
 * canonical shape. Gemini ends a turn that calls a function with STOP, so a response with function
 * calls reads as `tool_calls`; it names no stop sequence, so `stop_sequence` is written as STOP.
 * Gemini sends a function call whole: the stream writer holds a call's argument pieces until the
 * stream finishes, then sends the calls in one chunk.
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

const FILTERED = new Set(['SAFETY', 'RECITATION', 'BLOCKLIST', 'PROHIBITED_CONTENT', 'SPII', 'IMAGE_SAFETY']);
const FINISH_WRITE: Record<StopReason, string> = {
  end: 'STOP',
  stop_sequence: 'STOP',
  tool_calls: 'STOP',
  max_tokens: 'MAX_TOKENS',
  content_filter: 'SAFETY',
};

function stopReasonOf(finishReason: unknown, calledTools: boolean): StopReason {
  if (finishReason === 'MAX_TOKENS') return 'max_tokens';
  if (typeof finishReason === 'string' && FILTERED.has(finishReason)) return 'content_filter';
  return calledTools ? 'tool_calls' : 'end';
}

const count = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) ? value : 0);

function readUsage(metadata: unknown): Usage {
  if (!isObject(metadata)) return { inputTokens: 0, outputTokens: 0 };
  const usage: Usage = {
    inputTokens: count(metadata.promptTokenCount) + count(metadata.toolUsePromptTokenCount),
    outputTokens: count(metadata.candidatesTokenCount) + count(metadata.thoughtsTokenCount),
  };
  if (count(metadata.cachedContentTokenCount) > 0) usage.cachedInputTokens = count(metadata.cachedContentTokenCount);
  return usage;
}

function writeUsage(usage: Usage): JsonObject {
  const metadata: JsonObject = {
    promptTokenCount: usage.inputTokens,
    candidatesTokenCount: usage.outputTokens,
    totalTokenCount: usage.inputTokens + usage.outputTokens,
  };
  if (usage.cachedInputTokens !== undefined) metadata.cachedContentTokenCount = usage.cachedInputTokens;
  return metadata;
}

/** A call without an id (older Gemini) gets one from the response and its place in it. */
function callId(call: JsonObject, responseId: string, index: number): string {
  return typeof call.id === 'string' && call.id !== '' ? call.id : `call_${responseId}_${index}`;
}

function candidateParts(candidate: JsonObject): JsonObject[] {
  const content = isObject(candidate.content) ? candidate.content : {};
  return Array.isArray(content.parts) ? content.parts.filter(isObject) : [];
}

export function readGoogleResponse(body: JsonObject): ChatResponse {
  const candidate = Array.isArray(body.candidates) && isObject(body.candidates[0]) ? body.candidates[0] : {};
  const id = String(body.responseId ?? '');
  const parts: ResponsePart[] = [];
  let calls = 0;
  for (const part of candidateParts(candidate)) {
    if (typeof part.text === 'string' && part.thought !== true) {
      const last = parts.at(-1);
      if (last?.type === 'text') last.text += part.text;
      else if (part.text !== '') parts.push({ type: 'text', text: part.text });
    }
    if (isObject(part.functionCall)) {
      const call = part.functionCall;
      parts.push({ type: 'tool_call', call: { id: callId(call, id, calls++), name: String(call.name ?? ''), arguments: isObject(call.args) ? call.args : {} } });
    }
  }
  return { id, model: String(body.modelVersion ?? ''), parts, stopReason: stopReasonOf(candidate.finishReason, calls > 0), usage: readUsage(body.usageMetadata) };
}

export function writeGoogleResponse(response: ChatResponse): JsonObject {
  const parts = response.parts.map((part) =>
    part.type === 'text' ? { text: part.text } : { functionCall: { id: part.call.id, name: part.call.name, args: part.call.arguments } },
  );
  return {
    candidates: [{ content: { role: 'model', parts }, finishReason: FINISH_WRITE[response.stopReason], index: 0 }],
    usageMetadata: writeUsage(response.usage),
    modelVersion: response.model,
    responseId: response.id,
  };
}

const STATUSES: Record<ErrorKind, string> = {
  invalid_request: 'INVALID_ARGUMENT',
  authentication: 'UNAUTHENTICATED',
  permission: 'PERMISSION_DENIED',
  not_found: 'NOT_FOUND',
  rate_limit: 'RESOURCE_EXHAUSTED',
  overloaded: 'UNAVAILABLE',
  server: 'INTERNAL',
};

export function writeGoogleError(error: ProviderError, status: number): JsonObject {
  return { error: { code: status, message: error.message, status: STATUSES[error.kind] } };
}

/** Reads `alt=sse` chunks: each a whole GenerateContentResponse; the latest usageMetadata is the total. */
export function createGoogleStreamDecoder(): StreamDecoder {
  let started = false;
  let calls = 0;
  let usage: Usage | undefined;
  let finished = false;
  const push = (data: string): StreamEvent[] => {
    const chunk = streamEventObject(data);
    if (!chunk) return [];
    const events: StreamEvent[] = [];
    const id = String(chunk.responseId ?? '');
    if (!started) {
      started = true;
      events.push({ type: 'start', id, model: String(chunk.modelVersion ?? '') });
    }
    const candidate = Array.isArray(chunk.candidates) && isObject(chunk.candidates[0]) ? chunk.candidates[0] : {};
    for (const part of candidateParts(candidate)) {
      if (typeof part.text === 'string' && part.text !== '' && part.thought !== true) events.push({ type: 'text', text: part.text });
      if (isObject(part.functionCall)) {
        const call = part.functionCall;
        const index = calls++;
        events.push({ type: 'tool_call', index, id: callId(call, id, index), name: String(call.name ?? ''), argumentsDelta: JSON.stringify(isObject(call.args) ? call.args : {}) });
      }
    }
    if (isObject(chunk.usageMetadata)) usage = readUsage(chunk.usageMetadata);
    if (typeof candidate.finishReason === 'string' && !finished) {
      finished = true;
      events.push({ type: 'finish', stopReason: stopReasonOf(candidate.finishReason, calls > 0) });
    }
    return events;
  };
  // Gemini has no end marker: a stream that finished ends with its last usage.
  const end = (): StreamEvent[] => (finished ? [{ type: 'usage', usage: usage ?? { inputTokens: 0, outputTokens: 0 } }, { type: 'done' }] : []);
  return { push, end };
}

/** Writes `alt=sse` chunks: text as it comes, function calls whole, finish reason and usage last. */
export function createGoogleStreamEncoder(): StreamEncoder {
  let id = '';
  let model = '';
  let finishReason = 'STOP';
  let usage: Usage = { inputTokens: 0, outputTokens: 0 };
  const calls: { id: string; name: string; args: string }[] = [];
  const chunk = (parts: JsonObject[], last: boolean) => {
    const candidate: JsonObject = { content: { role: 'model', parts }, index: 0 };
    if (last) candidate.finishReason = finishReason;
    const body: JsonObject = { candidates: [candidate] };
    if (last) body.usageMetadata = writeUsage(usage);
    body.modelVersion = model;
    body.responseId = id;
    return sseEvent(body);
  };
  return (event) => {
    switch (event.type) {
      case 'start':
        ({ id, model } = event);
        return '';
      case 'text':
        return chunk([{ text: event.text }], false);
      case 'tool_call': {
        const call = calls[event.index] ?? (calls[event.index] = { id: '', name: '', args: '' });
        if (event.id !== undefined) call.id = event.id;
        if (event.name !== undefined) call.name = event.name;
        call.args += event.argumentsDelta;
        return '';
      }
      case 'finish':
        finishReason = FINISH_WRITE[event.stopReason];
        return '';
      case 'usage':
        usage = event.usage;
        return '';
      case 'done': {
        const parts = calls.filter(Boolean).map((c) => ({ functionCall: { id: c.id, name: c.name, args: parseArgs(c.args) } }));
        return chunk(parts.length > 0 ? parts : [{ text: '' }], true);
      }
    }
  };
}

function parseArgs(text: string): JsonObject {
  try {
    const parsed: unknown = JSON.parse(text === '' ? '{}' : text);
    return isObject(parsed) ? parsed : {};
  } catch {
    return {};
  }
}
