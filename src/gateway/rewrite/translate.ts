/**
 * The rewrite proxy's translations, pure: a client's request into a provider's format through the
 * canonical shape, and the provider's answer (JSON, error or event stream) back into the client's.
 */
import { createSseReader } from '../../providers/sse.ts';
import type { SseEvent } from '../../providers/types.ts';
import { ApiError } from '../../http/errors.ts';
import { readAnthropicRequest, writeAnthropicRequest } from './anthropic-request.ts';
import {
  createAnthropicStreamDecoder,
  createAnthropicStreamEncoder,
  readAnthropicResponse,
  writeAnthropicError,
  writeAnthropicResponse,
} from './anthropic-response.ts';
import {
  isObject,
  readProviderError,
  Untranslatable,
  type ChatRequest,
  type ChatResponse,
  type ClientApi,
  type JsonObject,
  type ProviderError,
  type ResponseContext,
  type RewriteFormat,
  type StreamDecoder,
  type StreamEncoder,
} from './canonical.ts';
import { readGoogleRequest, writeGoogleRequest, type GoogleCall } from './google-request.ts';
import {
  createGoogleStreamDecoder,
  createGoogleStreamEncoder,
  readGoogleResponse,
  writeGoogleError,
  writeGoogleResponse,
} from './google-response.ts';
import { readOpenAIRequest, writeOpenAIRequest } from './openai-request.ts';
import { readResponsesRequest } from './responses-request.ts';
import { createResponsesStreamEncoder, writeResponsesResponse } from './responses-response.ts';
import {
  createOpenAIStreamDecoder,
  createOpenAIStreamEncoder,
  readOpenAIResponse,
  writeOpenAIError,
  writeOpenAIResponse,
} from './openai-response.ts';

/** The client's stream wishes a writer needs (OpenAI's usage chunk is sent only when asked for). */
export type ClientStreamContext = ResponseContext & { includeUsage: boolean };

export type Codec = {
  readRequest(body: JsonObject, call: GoogleCall, problems: Untranslatable): ChatRequest;
  writeRequest(request: ChatRequest, problems: Untranslatable): JsonObject;
  readResponse(body: JsonObject): ChatResponse;
  writeResponse(response: ChatResponse, ctx: ResponseContext): JsonObject;
  readError(status: number, body: unknown): ProviderError;
  writeError(error: ProviderError, status: number): JsonObject;
  streamDecoder(): StreamDecoder;
  streamEncoder(ctx: ClientStreamContext): StreamEncoder;
};

export const CODECS: Record<RewriteFormat, Codec> = {
  openai: {
    readRequest: (body, _call, problems) => readOpenAIRequest(body, problems),
    writeRequest: writeOpenAIRequest,
    readResponse: readOpenAIResponse,
    writeResponse: writeOpenAIResponse,
    readError: readProviderError,
    writeError: writeOpenAIError,
    streamDecoder: createOpenAIStreamDecoder,
    streamEncoder: createOpenAIStreamEncoder,
  },
  anthropic: {
    readRequest: (body, _call, problems) => readAnthropicRequest(body, problems),
    writeRequest: writeAnthropicRequest,
    readResponse: readAnthropicResponse,
    writeResponse: writeAnthropicResponse,
    readError: readProviderError,
    writeError: writeAnthropicError,
    streamDecoder: createAnthropicStreamDecoder,
    streamEncoder: createAnthropicStreamEncoder,
  },
  google: {
    readRequest: readGoogleRequest,
    writeRequest: writeGoogleRequest,
    readResponse: readGoogleResponse,
    writeResponse: writeGoogleResponse,
    readError: readProviderError,
    writeError: writeGoogleError,
    streamDecoder: createGoogleStreamDecoder,
    streamEncoder: createGoogleStreamEncoder,
  },
};

/** What a client's side of a translation needs: its request read, its answers written. */
export type ClientCodec = Pick<Codec, 'readRequest' | 'writeResponse' | 'writeError' | 'streamEncoder'>;

/** Every API a client may speak: the three formats, and OpenAI's Responses API (a client only). */
const CLIENT_CODECS: Record<ClientApi, ClientCodec> = {
  ...CODECS,
  responses: {
    readRequest: (body, _call, problems) => readResponsesRequest(body, problems),
    writeResponse: writeResponsesResponse,
    writeError: writeOpenAIError,
    streamEncoder: createResponsesStreamEncoder,
  },
};

export type TranslatedRequest = { request: ChatRequest; body: JsonObject };

/**
 * A client's request body in the provider's format. Anything either side cannot express is
 * refused with `untranslatable_request`, every such field named in `issues`.
 */
export function translateRequest(client: ClientApi, provider: RewriteFormat, body: unknown, call: GoogleCall): TranslatedRequest {
  if (!isObject(body)) throw new ApiError('invalid_json', 'The request body must be a JSON object.');
  const problems = new Untranslatable();
  const request = CLIENT_CODECS[client].readRequest(body, call, problems);
  const written = CODECS[provider].writeRequest(request, problems);
  if (problems.issues.length > 0) {
    const names = problems.issues.map((issue) => issue.path.join('.') || '(body)');
    throw new ApiError(
      'untranslatable_request',
      `These fields cannot be translated from ${client} to ${provider}: ${[...new Set(names)].join(', ')}.`,
      { issues: problems.issues },
    );
  }
  return { request, body: written };
}

/** A provider's whole answer (success or error) in the client's format. */
export function translateResponseBody(provider: RewriteFormat, client: ClientApi, status: number, body: unknown, ctx: ResponseContext): JsonObject {
  if (status >= 400 || !isObject(body)) {
    const error = CODECS[provider].readError(status, body);
    return CLIENT_CODECS[client].writeError(error, status);
  }
  return CLIENT_CODECS[client].writeResponse(CODECS[provider].readResponse(body), ctx);
}

/**
 * A provider's event stream as the client's: each pushed piece of text yields the client's text.
 * `seen`, when given, gets each of the provider's events as read, untranslated (its meter's share).
 */
export function createStreamTranslator(provider: RewriteFormat, client: ClientApi, ctx: ClientStreamContext, seen?: (event: SseEvent) => void) {
  const decoder = CODECS[provider].streamDecoder();
  const encoder = CLIENT_CODECS[client].streamEncoder(ctx);
  let out = '';
  const reader = createSseReader((event) => {
    for (const translated of decoder.push(event.data, event.event)) out += encoder(translated);
    seen?.(event);
  });
  const take = (): string => {
    const text = out;
    out = '';
    return text;
  };
  return {
    push(chunk: string | Uint8Array): string {
      reader.push(chunk);
      return take();
    },
    end(): string {
      reader.end();
      for (const translated of decoder.end()) out += encoder(translated);
      return take();
    },
  };
}
