import type { HoldRules, MediaTokenRules } from './types.ts';

/**
 * Token estimates. The rough ones below are used when a stream was cut before the provider reported
 * its own counts (or a provider never reports them); such usage is always flagged `estimated: true`.
 * The hold bounds further down are upper bounds, used for the hold (decision 0019).
 *
 * The rule is the common "about 4 characters per token" for English text. It is not a tokenizer:
 * it under-counts code and non-Latin scripts and ignores images and audio. It exists so that a
 * cut stream is billed for roughly what was produced, never silently free.
 */
export const CHARACTERS_PER_TOKEN_ESTIMATE = 4;

export function estimateTokensFromCharacters(characters: number): number {
  return Math.ceil(characters / CHARACTERS_PER_TOKEN_ESTIMATE);
}

/**
 * Keys whose values are identifiers or binary payloads rather than prompt text: counting a base64
 * image or a model name as prompt text would inflate the estimate.
 */
const NON_PROMPT_KEYS = new Set([
  'model',
  'model_id',
  'role',
  'type',
  'id',
  'tool_call_id',
  'image_url',
  'input_audio',
  'file_data',
  'file_id',
  'data',
  'inline_data',
  'inlineData',
  'fileData',
  'mime_type',
  'mimeType',
  'stream_options',
  'cache_control',
]);

/**
 * Real prompts nest a few levels deep; a hostile body nested thousands deep must not overflow the
 * stack while a request is being settled.
 */
const MAX_DEPTH = 64;

/** Estimated input tokens of a JSON request body: every string in it that can be prompt text. */
export function estimateInputTokensFromRequest(requestBody: unknown): number {
  return estimateTokensFromCharacters(promptCharacters(requestBody, 0));
}

/** Estimated output tokens of a JSON response: its text, as for a request (ids, vectors left out). */
export function estimateOutputTokensFromResponse(responseBody: unknown): number {
  return estimateTokensFromCharacters(promptCharacters(responseBody, 0));
}

/**
 * Endpoints every provider bills by usage (generation and embeddings, in the OpenAI, Anthropic and
 * Gemini shapes): a successful answer to one of them is never free, even when it reports no usage.
 * Listing, retrieval and token-counting endpoints are not among them.
 */
const USAGE_BILLED_PATH =
  /(?:\/chat\/completions|\/completions|\/responses|\/embeddings|\/messages|:generateContent|:streamGenerateContent|:embedContent|:batchEmbedContents)$/;

export function isUsageBilledRequest(method: string, url: URL): boolean {
  return method === 'POST' && USAGE_BILLED_PATH.test(url.pathname);
}

function promptCharacters(value: unknown, depth: number): number {
  if (typeof value === 'string') return value.startsWith('data:') ? 0 : value.length;
  if (typeof value !== 'object' || value === null || depth >= MAX_DEPTH) return 0;
  if (Array.isArray(value)) return value.reduce<number>((sum, item) => sum + promptCharacters(item, depth + 1), 0);
  let sum = 0;
  for (const [key, child] of Object.entries(value)) {
    if (!NON_PROMPT_KEYS.has(key)) sum += promptCharacters(child, depth + 1);
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Hold bounds (decision 0019): what a request can cost at most, by its provider's rules.

const OUTPUT_CAP_FIELDS = ['max_tokens', 'max_completion_tokens', 'max_output_tokens'] as const;

/** A positive whole number of tokens, or undefined. */
export function tokenCount(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isSafeInteger(value) && value > 0 ? value : undefined;
}

/** The output cap of the OpenAI and Anthropic shapes (`max_tokens` and its cousins). */
export function topLevelOutputCap(body: unknown): number | undefined {
  if (typeof body !== 'object' || body === null) return undefined;
  const record = body as Record<string, unknown>;
  for (const field of OUTPUT_CAP_FIELDS) {
    const cap = tokenCount(record[field]);
    if (cap !== undefined) return cap;
  }
  return undefined;
}

/**
 * Output maxima of OpenAI's model families, by name prefix (longest first): the published maximum
 * output (reasoning tokens included) of each family's largest member.
 */
const OPENAI_MAX_OUTPUT: readonly [RegExp, number][] = [
  [/^gpt-5/, 128_000],
  [/^o\d/, 100_000],
  [/^gpt-4\.1/, 32_768],
  [/^gpt-4o/, 16_384],
  [/^gpt-4-turbo|^gpt-4-\d{4}-preview/, 4_096],
  [/^gpt-4\b/, 8_192],
  [/^gpt-3\.5/, 4_096],
];

function openAIMaxOutputTokens(model: string | null): number | undefined {
  if (!model) return undefined;
  return OPENAI_MAX_OUTPUT.find(([shape]) => shape.test(model))?.[1];
}

/** A non-empty string member, or undefined. */
function idAt(record: unknown, key: string): string | undefined {
  if (typeof record !== 'object' || record === null) return undefined;
  const value = (record as Record<string, unknown>)[key];
  return typeof value === 'string' && value.length > 0 ? value : undefined;
}

/**
 * Context the OpenAI Responses API keeps for a request that only names it: the conversation so far
 * (`previous_response_id`, `conversation` by id or as `{id}`) and a stored prompt (`prompt.id`,
 * with its version).
 */
function openAIContextReferences(body: unknown): string[] {
  const keys: string[] = [];
  const previous = idAt(body, 'previous_response_id');
  if (previous) keys.push(`openai:response:${previous}`);
  const record = typeof body === 'object' && body !== null ? (body as Record<string, unknown>) : {};
  const conversation = typeof record.conversation === 'string' ? record.conversation : idAt(record.conversation, 'id');
  if (conversation) keys.push(`openai:conversation:${conversation}`);
  const prompt = idAt(record.prompt, 'id');
  if (prompt) keys.push(`openai:prompt:${prompt}:${idAt(record.prompt, 'version') ?? 'latest'}`);
  return keys;
}

/** A Responses API answer (`resp_…`) can be named by a later request's previous_response_id. */
function openAIAnswerContextReference(responseId: string): string | null {
  return responseId.startsWith('resp_') ? `openai:response:${responseId}` : null;
}

/**
 * The OpenAI shapes' rules: an image counts at most 85 + 170 × 8 tiles = 1,445 tokens in
 * detail: high (resized to fit 2048 × 768), and up to 1,536 patches × 1.72 ≈ 2,642 on the
 * patch-priced models: 2,700 covers both. Audio input counts ~10 tokens a second; 25 is held.
 */
export const DEFAULT_HOLD_RULES: HoldRules = {
  outputCapFrom: topLevelOutputCap,
  maxOutputTokens: openAIMaxOutputTokens,
  media: { perImage: 2_700, perAudioSecond: 25, perVideoSecond: 300, perFileByte: 1 },
  contextReferences: openAIContextReferences,
  answerContextReference: openAIAnswerContextReference,
};

/**
 * Inline audio is held as if at 4 kbit/s and video at 50 kbit/s, below what their codecs use for
 * speech and for moving pictures: the longest duration their bytes can hold.
 */
const AUDIO_BYTES_PER_SECOND_AT_LEAST = 500;
const VIDEO_BYTES_PER_SECOND_AT_LEAST = 6_250;

type MediaKind = 'image' | 'audio' | 'video' | 'file';

/** The decoded size of base64 text (a `data:` URL's payload included), in bytes. */
function base64Bytes(text: string): number {
  const comma = text.startsWith('data:') ? text.indexOf(',') + 1 : 0;
  return Math.floor(((text.length - comma) * 3) / 4);
}

function kindOfMime(mime: unknown): MediaKind {
  if (typeof mime !== 'string') return 'file';
  if (mime.startsWith('image/')) return 'image';
  if (mime.startsWith('audio/')) return 'audio';
  if (mime.startsWith('video/')) return 'video';
  return 'file';
}

/**
 * One media item of a request part, in any provider's shape, with its decoded size when it is
 * inline (null when it is named by URL or upload id); null when the part is not media.
 *  - OpenAI: `image_url`, `input_image`, `input_audio`, `file` / `input_file`;
 *  - Anthropic: `image` and `document` with a `source`;
 *  - Gemini: `inlineData` / `inline_data`, `fileData` / `file_data`.
 */
function mediaItemOf(part: Record<string, unknown>): { kind: MediaKind; bytes: number | null } | null {
  const inline = (part.inlineData ?? part.inline_data) as Record<string, unknown> | undefined;
  if (inline && typeof inline === 'object') {
    const mime = inline.mimeType ?? inline.mime_type;
    return { kind: kindOfMime(mime), bytes: typeof inline.data === 'string' ? base64Bytes(inline.data) : null };
  }
  const byReference = (part.fileData ?? part.file_data) as Record<string, unknown> | undefined;
  if (byReference && typeof byReference === 'object' && !Array.isArray(byReference) && part.type === undefined) {
    return { kind: kindOfMime(byReference.mimeType ?? byReference.mime_type), bytes: null };
  }
  switch (part.type) {
    case 'image_url':
    case 'input_image':
    case 'image':
      return { kind: 'image', bytes: null };
    case 'input_audio': {
      const data = (part.input_audio as Record<string, unknown> | undefined)?.data;
      return { kind: 'audio', bytes: typeof data === 'string' ? base64Bytes(data) : null };
    }
    case 'file':
    case 'input_file':
    case 'document': {
      const holder = (part.file ?? part.source ?? part) as Record<string, unknown>;
      const data = holder.file_data ?? holder.data;
      const kind = part.type === 'document' && holder.media_type !== undefined ? kindOfMime(holder.media_type) : 'file';
      return { kind, bytes: typeof data === 'string' ? base64Bytes(data) : null };
    }
    default:
      return null;
  }
}

/**
 * What is held for audio, video or a document named by reference (an upload's id or URI) unless
 * the operator says otherwise (MEDIA_REFERENCE_HOLD_TOKENS): its size is not known, so this is an
 * allowance, not a bound (decision 0019). Images by reference are held at the provider's per-image
 * maximum, which is a bound.
 */
export const DEFAULT_REFERENCE_HOLD_TOKENS = 10_000;

/**
 * What is held for provider-side context a request names (a previous response, cached content, a
 * stored prompt) whose size the gateway has not learned, unless the operator says otherwise
 * (PROVIDER_CONTEXT_HOLD_TOKENS): an allowance, not a bound (decision 0025).
 */
export const DEFAULT_CONTEXT_HOLD_TOKENS = 32_000;

/**
 * Input tokens the request's media can count for at most, by the provider's rules (text is bounded
 * apart); each audio, video or document named by reference counts `referenceTokens`.
 */
export function mediaInputTokens(requestBody: unknown, rules: MediaTokenRules, referenceTokens = DEFAULT_REFERENCE_HOLD_TOKENS): number {
  let tokens = 0;
  const stack: { value: unknown; depth: number }[] = [{ value: requestBody, depth: 0 }];
  while (stack.length > 0) {
    const { value, depth } = stack.pop()!;
    if (typeof value !== 'object' || value === null || depth >= MAX_DEPTH) continue;
    if (Array.isArray(value)) {
      for (const item of value) stack.push({ value: item, depth: depth + 1 });
      continue;
    }
    const item = mediaItemOf(value as Record<string, unknown>);
    if (item) {
      tokens += mediaTokens(item, rules, referenceTokens);
      continue;
    }
    for (const child of Object.values(value)) stack.push({ value: child, depth: depth + 1 });
  }
  return tokens;
}

function mediaTokens(item: { kind: MediaKind; bytes: number | null }, rules: MediaTokenRules, referenceTokens: number): number {
  if (item.kind === 'image') return rules.perImage;
  if (item.bytes === null) return referenceTokens;
  if (item.kind === 'audio') return Math.ceil(item.bytes / AUDIO_BYTES_PER_SECOND_AT_LEAST) * rules.perAudioSecond;
  if (item.kind === 'video') return Math.ceil(item.bytes / VIDEO_BYTES_PER_SECOND_AT_LEAST) * rules.perVideoSecond;
  return Math.ceil(item.bytes * rules.perFileByte);
}
