/**
 * Rough token estimates, used ONLY when a stream was cut before the provider reported its own
 * counts (or a provider never reports them). Such usage is always flagged `estimated: true`.
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
