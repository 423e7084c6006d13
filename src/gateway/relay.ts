import type { ServerResponse } from 'node:http';
import { Agent, errors as undiciErrors, request as undiciRequest, type Dispatcher } from 'undici';
import type { MeterContext, ProviderModule, StreamUsage, UsageReport } from '../providers/types.ts';
import { createSseEventFilter } from './sse-filter.ts';

/**
 * One pooled, keep-alive client for every upstream; redirects are never followed (SSRF wall).
 * A request that carries `requestSent` has it set once undici hands the request to a connected
 * socket: from then on the provider may be working on it (see RelayOutcome `abandoned`).
 */
export function createUpstreamAgent(opts: { headersTimeoutMs: number; bodyTimeoutMs: number }): Dispatcher {
  const agent = new Agent({
    keepAliveTimeout: 30_000,
    connections: 256,
    headersTimeout: opts.headersTimeoutMs,
    bodyTimeout: opts.bodyTimeoutMs,
  });
  return agent.compose((dispatch) => (options, handler) => {
    const sent = (options as { requestSent?: SentFlag }).requestSent;
    return dispatch(options, sent ? new SentTrackingHandler(handler, sent) : handler);
  });
}

type SentFlag = { value: boolean };

/** Passes every event through; notes when the request starts on a connection and was not aborted. */
class SentTrackingHandler implements Dispatcher.DispatchHandler {
  readonly #inner: Dispatcher.DispatchHandler;
  readonly #sent: SentFlag;

  constructor(inner: Dispatcher.DispatchHandler, sent: SentFlag) {
    this.#inner = inner;
    this.#sent = sent;
  }

  onRequestStart(controller: Dispatcher.DispatchController, context: unknown): void {
    this.#inner.onRequestStart?.(controller, context);
    // The request handler aborts here when the client already left: then nothing is written.
    if (!controller.aborted) this.#sent.value = true;
  }
  onRequestUpgrade(...args: Parameters<NonNullable<Dispatcher.DispatchHandler['onRequestUpgrade']>>): void {
    this.#inner.onRequestUpgrade?.(...args);
  }
  onResponseStart(...args: Parameters<NonNullable<Dispatcher.DispatchHandler['onResponseStart']>>): void {
    this.#inner.onResponseStart?.(...args);
  }
  onResponseData(...args: Parameters<NonNullable<Dispatcher.DispatchHandler['onResponseData']>>): void {
    this.#inner.onResponseData?.(...args);
  }
  onResponseEnd(...args: Parameters<NonNullable<Dispatcher.DispatchHandler['onResponseEnd']>>): void {
    this.#inner.onResponseEnd?.(...args);
  }
  onResponseError(...args: Parameters<NonNullable<Dispatcher.DispatchHandler['onResponseError']>>): void {
    this.#inner.onResponseError?.(...args);
  }
}

export type RelayRequest = {
  agent: Dispatcher;
  upstreamUrl: URL;
  method: string;
  headers: Record<string, string>;
  body: Buffer | undefined;
  provider: ProviderModule;
  meterContext: MeterContext;
  /** The gateway asked for a usage event the client did not: hide it from the client. */
  hideInjectedUsage: boolean;
  /** Response headers Tollgate adds (x-tollgate-request-id). */
  extraHeaders: Record<string, string>;
  res: ServerResponse;
  /** True once the server is shutting down: the client's connection is then not kept alive. */
  closing?: () => boolean;
};

export type RelayOutcome =
  | {
      kind: 'answered';
      status: number;
      usage: UsageReport | StreamUsage | null;
      responseBody: unknown;
      clientAborted: boolean;
      /** A non-streaming body ended before its end (provider cut or client gone); its characters seen. */
      cutBody: { characters: number } | null;
    }
  /** The client left before the provider answered; `requestSent`: the provider had the request. */
  | { kind: 'abandoned'; requestSent: boolean }
  | { kind: 'failed'; reason: 'timeout' | 'unreachable' };

/** Headers that describe one hop, never the message: not relayed in either direction. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'content-length',
]);

/**
 * Sends the request upstream and relays the answer to the client as it arrives: event streams
 * chunk by chunk, other bodies as they come, while the provider module meters the bytes in passing.
 * A client that goes away aborts the upstream call; what was seen until then is still metered.
 */
export async function relay(r: RelayRequest): Promise<RelayOutcome> {
  try {
    return await relayAndMeter(r);
  } finally {
    if (r.closing?.()) closeAfterResponse(r.res);
  }
}

/**
 * A hijacked response bypasses Fastify's shutdown handling, and a keep-alive socket left open after
 * it would hold `app.close()` until the socket's keep-alive timeout. During shutdown the socket is
 * ended as soon as the response has been sent.
 */
export function closeAfterResponse(res: ServerResponse): void {
  const socket = res.socket;
  if (!socket || socket.destroyed) return;
  if (res.writableFinished) socket.end();
  else res.once('finish', () => socket.end());
}

/** `Connection: close` on a response started while the server is shutting down. */
export function shutdownHeaders(closing: (() => boolean) | undefined): Record<string, string> {
  return closing?.() ? { connection: 'close' } : {};
}

async function relayAndMeter(r: RelayRequest): Promise<RelayOutcome> {
  const abort = new AbortController();
  const onClientGone = () => {
    if (!r.res.writableFinished) abort.abort();
  };
  r.res.on('close', onClientGone);

  const requestSent: SentFlag = { value: false };
  let upstream: Dispatcher.ResponseData;
  try {
    // requestSent is not undici's: it rides along in the options to createUpstreamAgent's interceptor.
    const options = {
      dispatcher: r.agent,
      method: r.method as Dispatcher.HttpMethod,
      headers: r.headers,
      body: r.body,
      signal: abort.signal,
      requestSent,
    };
    const answer = await Promise.race([undiciRequest(r.upstreamUrl, options), clientGone(abort.signal)]);
    // undici applies an abort only once a connection is up: a client that left while the
    // connection was still being made would otherwise wait for it (or its timeout).
    if (answer === null) throw abort.signal.reason;
    upstream = answer;
  } catch (e) {
    r.res.off('close', onClientGone);
    if (abort.signal.aborted) return { kind: 'abandoned', requestSent: requestSent.value };
    return { kind: 'failed', reason: isTimeout(e) ? 'timeout' : 'unreachable' };
  }

  const contentType = String(upstream.headers['content-type'] ?? '');
  const ok = upstream.statusCode < 400;
  const isStream = ok && contentType.includes('text/event-stream');
  // A body relayed unchanged keeps its length: no chunked framing, and a body that arrives in
  // one piece leaves with its headers in one write.
  const length = isStream ? null : contentLength(upstream);
  r.res.writeHead(upstream.statusCode, {
    ...responseHeaders(upstream.headers),
    ...(length === null ? {} : { 'content-length': String(length) }),
    ...r.extraHeaders,
    ...shutdownHeaders(r.closing),
  });

  try {
    if (isStream) return await relayStream(r, upstream, abort);
    return await relayBody(r, upstream, contentType, ok, abort, length);
  } finally {
    r.res.off('close', onClientGone);
  }
}

/** Resolves with null when the client has gone; the request itself settles its own promise. */
function clientGone(signal: AbortSignal): Promise<null> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve(null);
    else signal.addEventListener('abort', () => resolve(null), { once: true });
  });
}

async function relayStream(r: RelayRequest, upstream: Dispatcher.ResponseData, abort: AbortController): Promise<RelayOutcome> {
  const meter = r.provider.createStreamMeter(r.meterContext);
  const { provider } = r;
  const filter = r.hideInjectedUsage
    ? createSseEventFilter((event, raw) =>
        provider.isInjectedUsageEvent(event) ? null : (provider.stripInjectedUsageFields?.(raw) ?? raw),
      )
    : null;
  let clientAborted = false;
  let cut = false;
  try {
    for await (const chunk of upstream.body) {
      const bytes = chunk as Buffer;
      meter.push(bytes);
      await write(r.res, filter ? filter.push(bytes) : bytes);
    }
    if (filter) await write(r.res, filter.end());
  } catch {
    // The client left (abort) or the provider cut the stream: settle from what was seen.
    clientAborted = abort.signal.aborted;
    cut = !clientAborted;
  }
  endResponse(r.res, cut);
  return { kind: 'answered', status: upstream.statusCode, usage: meter.finish(), responseBody: null, clientAborted, cutBody: null };
}

async function relayBody(
  r: RelayRequest,
  upstream: Dispatcher.ResponseData,
  contentType: string,
  ok: boolean,
  abort: AbortController,
  length: number | null,
): Promise<RelayOutcome> {
  const isJson = contentType.includes('json');
  const kept: Buffer[] = [];
  let clientAborted = false;
  let cut = false;
  let received = 0;
  let last: Buffer | undefined;
  try {
    for await (const chunk of upstream.body) {
      const bytes = chunk as Buffer;
      if (isJson && ok) kept.push(bytes);
      received += bytes.length;
      // The chunk that completes a body of known length goes out with the end of the response.
      if (length !== null && received >= length && last === undefined) last = bytes;
      else await write(r.res, bytes);
    }
  } catch {
    clientAborted = abort.signal.aborted;
    cut = !clientAborted;
  }
  endResponse(r.res, cut, last);
  if (!ok) return { kind: 'answered', status: upstream.statusCode, usage: null, responseBody: null, clientAborted, cutBody: null };
  const cutBody = cut || clientAborted ? { characters: charactersOf(kept, received) } : null;
  const responseBody = isJson && !cutBody ? parseJson(Buffer.concat(kept)) : null;
  const usage = isJson
    ? r.provider.usageFromJson(responseBody, r.meterContext)
    : r.provider.usageFromRequest(r.meterContext);
  return { kind: 'answered', status: upstream.statusCode, usage, responseBody, clientAborted, cutBody };
}

/**
 * Respects back-pressure: a slow client slows the read from upstream instead of growing memory.
 * Both listeners are removed once either fires (a race of two `once()` promises would leave the
 * loser's listeners on the response for every drain).
 */
async function write(res: ServerResponse, data: string | Buffer): Promise<void> {
  if (data.length === 0 || res.destroyed) return;
  if (res.write(data)) return;
  await new Promise<void>((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/**
 * Ends the client's response. When the provider cut its body mid-way the client's response is
 * cut too (destroyed, so no final chunk is sent): ending it cleanly would present a truncated
 * body or stream as complete.
 */
function endResponse(res: ServerResponse, upstreamCut = false, last?: Buffer): void {
  if (res.destroyed || res.writableEnded) return;
  if (upstreamCut) res.destroy();
  else res.end(last);
}

/** The upstream body's declared length, when it has exactly one valid one and a body at all. */
function contentLength(upstream: Dispatcher.ResponseData): number | null {
  const value = upstream.headers['content-length'];
  if (typeof value !== 'string' || !/^\d{1,15}$/.test(value)) return null;
  if (upstream.statusCode === 204 || upstream.statusCode === 304 || upstream.statusCode < 200) return null;
  return Number(value);
}

function responseHeaders(headers: Dispatcher.ResponseData['headers']): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !HOP_BY_HOP.has(name.toLowerCase())) out[name] = value;
  }
  return out;
}

/** Characters of the text kept (JSON), else the byte count: what an estimate can go on. */
function charactersOf(kept: Buffer[], received: number): number {
  return kept.length > 0 ? Buffer.concat(kept).toString('utf8').length : received;
}

function parseJson(bytes: Buffer): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch {
    return null;
  }
}

function isTimeout(e: unknown): boolean {
  return e instanceof undiciErrors.HeadersTimeoutError || e instanceof undiciErrors.ConnectTimeoutError;
}

/** Request headers that are the client's business with the provider; ours and hop-by-hop ones are dropped. */
export function upstreamRequestHeaders(
  incoming: Record<string, string | string[] | undefined>,
  bodyLength: number | undefined,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(incoming)) {
    const lower = name.toLowerCase();
    if (value === undefined || HOP_BY_HOP.has(lower) || DROPPED_REQUEST_HEADERS.has(lower)) continue;
    out[lower] = Array.isArray(value) ? value.join(', ') : value;
  }
  // Metering reads the response: ask for it uncompressed.
  out['accept-encoding'] = 'identity';
  if (bodyLength !== undefined) out['content-length'] = String(bodyLength);
  return out;
}

const DROPPED_REQUEST_HEADERS = new Set([
  'host',
  'authorization',
  'x-api-key',
  'x-goog-api-key',
  'xi-api-key',
  'x-service-metadata',
  'cookie',
  'idempotency-key',
  'x-request-id',
  'accept-encoding',
  'expect',
]);
