/**
 * The one shape every provider module has. The forward gateway only talks to providers through
 * this interface, so provider quirks (auth header, usage fields, stream framing) stay inside
 * the provider's own module and the relay stays provider-agnostic.
 *
 * Everything here is pure: no network, no clock, no storage.
 */

/** How a provider expects its API key. */
export type AuthStyle = 'bearer' | 'x-api-key' | 'x-goog-api-key' | 'xi-api-key';

/** Which module implements the provider; several providers share one family. */
export type ProviderFamily = 'openai-compatible' | 'anthropic' | 'google' | 'elevenlabs';

/**
 * Usage of one request, in every unit the billing side knows.
 *
 * Token convention (the same as @pydantic/genai-prices): `inputTokens` is ALL input tokens,
 * cached ones included; `cachedInputTokens` (read from a prompt cache) and
 * `cacheWriteInputTokens` (written to it) are subsets of it. Providers that report cached
 * tokens separately (Anthropic) are normalised to this convention by their module.
 */
export type UsageReport = {
  inputTokens: number;
  outputTokens: number;
  cachedInputTokens?: number;
  cacheWriteInputTokens?: number;
  /** Part of outputTokens the model spent reasoning (thinking), where the provider reports it. */
  reasoningTokens?: number;
  /** Part of inputTokens that is audio (priced apart by audio models). */
  audioInputTokens?: number;
  /** Images an image generation made. */
  outputImages?: number;
  inputCharacters: number;
  outputCharacters: number;
  inputSeconds: number;
  outputSeconds: number;
  model?: string;
  responseId?: string;
  /** When the provider says it answered (ISO 8601), for providers that report it. */
  completedAt?: string;
};

/** What a stream meter reports when the stream is over (or was cut). */
export type StreamUsage = UsageReport & {
  /** The provider's end-of-stream marker was seen ([DONE], message_stop, finishReason, response.completed). */
  complete: boolean;
  /** Some figure is an estimate (see estimate.ts) rather than the provider's own count. */
  estimated: boolean;
};

/** Everything a module may look at besides the response itself. */
export type MeterContext = {
  /** The upstream URL the request goes to. */
  url: URL;
  /** The parsed JSON request body (or parsed form fields); undefined when there is none. */
  requestBody: unknown;
  /** The gateway's clock (Unix milliseconds), which bounds the provider times believed. */
  now: number;
};

/**
 * Accumulates usage from a response stream as it is relayed. It holds no more of the stream's text
 * than a bounded part (events the OpenAI meter put aside: about a mebibyte of characters at most).
 */
export type StreamMeter = {
  /** Accepts the stream in any split: an event across chunks, or several events in one chunk. */
  push(chunk: string | Uint8Array): void;
  /**
   * An SSE meter also takes the stream as whole events another reader already split (the rewrite
   * proxy's), so a stream is read once for the client and the meter; a stream is fed one way only.
   */
  pushEvent?(event: SseEvent): void;
  /** Call once, when the upstream body has ended or failed. */
  finish(): StreamUsage;
};

/** One parsed server-sent event, as eventsource-parser yields it. */
export type SseEvent = { event?: string | undefined; id?: string | undefined; data: string };

/** Result of preparing a streaming request body for metering. */
export type PreparedStreamRequest = {
  /** The body to send upstream: the input itself when nothing had to change. */
  body: unknown;
  /**
   * True when the gateway added a usage request the client did not make; the relay must then hide
   * the extra usage-only event from the client (see ProviderModule.isInjectedUsageEvent).
   */
  injectedUsage: boolean;
};

/**
 * Headers the gateway builds for the upstream request: a WHATWG Headers object or a plain record
 * (as Fastify and undici use). Record keys are compared case-insensitively.
 */
export type HeaderTarget = Headers | Record<string, string | string[] | number | undefined>;

export type ProviderModule = {
  /** Stable id, stored on request records and used in allowed_providers. */
  readonly id: string;
  readonly displayName: string;
  readonly family: ProviderFamily;
  /** The documented base URL (what the SDK's `providers.*` map points at). */
  readonly baseUrl: string;
  /** Scheme the provider is reached with; built-in providers are https only. */
  readonly protocol: 'https:' | 'http:';
  /** Exact `URL.host` values (hostname, plus `:port` only when not the scheme's default). */
  readonly hosts: readonly string[];
  /**
   * Path prefixes (whole segments) this module understands on its hosts. The longest matching
   * prefix across all modules wins, which is how two providers share one host.
   */
  readonly basePaths: readonly string[];
  readonly authStyle: AuthStyle;
  /** Declared by the operator rather than built in. */
  readonly custom: boolean;

  /**
   * Puts the managed key in the provider's own header and removes every other credential header,
   * so that no client credential (e.g. a forward token in x-api-key) reaches the provider.
   */
  applyAuth(headers: HeaderTarget, key: string): void;
  /** Usage from a non-streaming JSON response; null when the response carries none. */
  usageFromJson(body: unknown, ctx: MeterContext): UsageReport | null;
  /** Usage known from the request alone (text-to-speech characters) for non-JSON responses. */
  usageFromRequest(ctx: MeterContext): UsageReport | null;
  createStreamMeter(ctx: MeterContext): StreamMeter;
  /** The model served: the response's own name when given, else the request's. */
  modelFrom(requestBody: unknown, url: URL, responseBody?: unknown): string | null;
  /** The provider's id for the response, if it has one. */
  responseId(body: unknown): string | null;
  /** Makes sure a streaming request will report usage; returns the body unchanged otherwise. */
  prepareStreamRequest(body: unknown, url: URL): PreparedStreamRequest;
  /** True for the usage-only event that exists only because prepareStreamRequest asked for it. */
  isInjectedUsageEvent(event: SseEvent): boolean;
  /**
   * For a kept event of a stream whose usage request was injected: the event's raw text without
   * the fields the injection added to it (OpenAI's `"usage":null` on every chunk); the same text
   * when there is nothing to remove. Absent = events are relayed unchanged.
   */
  stripInjectedUsageFields?(raw: string): string;
  /**
   * The path the provider serves for a path a client built by appending its own versioned path
   * to a versioned base URL (`/v1` + `/v1/messages`); absent = paths are used as given.
   */
  canonicalPath?(pathname: string): string;
  /** Whether a request to `url` with this body asks for an event stream (the body's flag, or the URL's method). */
  requestsStream(body: unknown, url: URL): boolean;
  /**
   * Model names this provider serves when a drop-in request does not name its provider
   * (`gpt-…` → OpenAI, `claude-…` → Anthropic); absent = reached only as `provider/model`.
   */
  readonly modelNames?: RegExp;
  /**
   * The provider whose account this one is another API of (Gemini's OpenAI-compatible path is
   * Google's): it is served with that provider's managed key when it has none of its own, priced
   * from that provider's catalog, and allowed wherever a spend key allows that provider.
   */
  readonly sharesAccountWith?: string;
  /**
   * This provider's rules for what a request can cost at most (the hold, decision 0019): where its
   * body sets the output cap, its models' output maxima, and what media count for. Absent = the
   * OpenAI shapes and counts (DEFAULT_HOLD_RULES in providers/estimate.ts).
   */
  holdRules?: HoldRules;
  /**
   * A provider that answers in process, with no network and no key (the built-in demo): the
   * gateway hands it the request instead of sending it anywhere. Absent = a real upstream.
   */
  answerLocally?(request: LocalRequest): LocalAnswer;
  /**
   * Base prices per 1M tokens of the models the price catalog does not know (the demo's own);
   * the operator's price overrides still come first. Absent = the catalog's prices only.
   */
  ownPrices?(model: string): { input: bigint; output: bigint } | null;
  /** The models it serves that the price catalog does not list (the demo's), shown in model lists. */
  ownModels?: readonly string[];
};

/** A request as a provider that answers locally sees it. */
export type LocalRequest = {
  method: string;
  url: URL;
  /** The JSON body, parsed; undefined when there is none or it is not JSON. */
  body: unknown;
  /** The gateway's clock (Unix milliseconds): providers read no clock of their own. */
  now: number;
};

/** A locally made answer: its body in the pieces it is sent in (an event stream's events). */
export type LocalAnswer = { status: number; headers: Record<string, string>; chunks: string[] };

/** What bounds a request's tokens by a provider's rules (see ProviderModule.holdRules). */
export type HoldRules = {
  /** The output-token cap the request sets, where this provider puts it; undefined when it sets none. */
  outputCapFrom(body: unknown): number | undefined;
  /** The most output tokens the model can produce, when known. */
  maxOutputTokens(model: string | null): number | undefined;
  /** Input tokens one media item can count for at most, by kind (see providers/estimate.ts). */
  media: MediaTokenRules;
  /**
   * Context the provider keeps and the request only names (a previous response, cached content, a
   * stored prompt), as keys the gateway remembers sizes under; absent or empty when none.
   */
  contextReferences?(body: unknown): string[];
  /** The key a later request names this answer's context by (a Responses API response id), or null. */
  answerContextReference?(responseId: string): string | null;
};

export type MediaTokenRules = {
  /** Tokens one image counts for at most, whatever its size (providers resize or tile to a maximum). */
  perImage: number;
  /** Tokens per second of audio and of video (its frames and its sound). */
  perAudioSecond: number;
  perVideoSecond: number;
  /** Tokens per byte of a document (PDF and other files: text and page images). */
  perFileByte: number;
};

