/**
 * The paths the mock provider serves, exactly as the real providers serve them once a test's
 * UPSTREAM_OVERRIDES maps their hosts to the mock (the public URL's path arrives unchanged). A
 * path no provider serves — `/v1/v1/chat/completions`, `/chat/completions` under OpenAI's host,
 * `/v1/models/gpt-4o:generateContent` sent to an OpenAI-shaped call — gets the provider's 404, so
 * a gateway that builds a wrong upstream URL fails its tests instead of passing them.
 *
 * Written from the providers' documentation, not from the gateway's registry, so a wrong base path
 * in the registry cannot make the mock agree with it.
 */

/**
 * Base paths of the OpenAI-compatible services the gateway knows: OpenAI, Mistral, xAI, … (`/v1`),
 * Groq (`/openai/v1`), Gemini's compatibility layer (`/v1beta/openai`), Novita (`/v3/openai`,
 * `/openai`), DeepInfra (`/v1/openai`), Cohere (`/compatibility/v1`), Fireworks (`/inference/v1`)
 * and DeepSeek, which also serves its API at the root (``).
 */
const OPENAI_BASES = ['/v1', '/openai/v1', '/v1beta/openai', '/v3/openai', '/openai', '/v1/openai', '/compatibility/v1', '/inference/v1', ''];

/** The OpenAI endpoints a POST reaches under each base. */
const OPENAI_POST_ENDPOINTS = [
  '/chat/completions',
  '/responses',
  '/embeddings',
  '/audio/speech',
  '/audio/transcriptions',
  '/audio/translations',
  '/images/generations',
  '/images/edits',
  '/images/variations',
];

const alternatives = (values: readonly string[]) => values.map((value) => value.replace(/[/.]/g, '\\$&')).join('|');

const OPENAI_POST = new RegExp(`^(?:${alternatives(OPENAI_BASES)})(?:${alternatives(OPENAI_POST_ENDPOINTS)})$`);
const OPENAI_MODELS = new RegExp(`^(?:${alternatives(OPENAI_BASES)})/models$`);

const ANTHROPIC_POST = /^\/v1\/messages(?:\/count_tokens)?$/;

/** Gemini's API versions; the model is one path segment, the method follows a colon. */
const GEMINI_POST = /^\/v1(?:beta|alpha)?\/models\/[^/:]+:(?:generateContent|streamGenerateContent|countTokens)$/;
const GEMINI_MODELS = /^\/v1(?:beta|alpha)?\/models$/;

const ELEVENLABS_POST = /^\/v1\/(?:text-to-speech\/[^/]+(?:\/stream)?|speech-to-text)$/;

/** Whether some provider serves this method and path (the query is not part of `path`). */
export function isProviderPath(method: string, path: string): boolean {
  if (method === 'GET') return OPENAI_MODELS.test(path) || GEMINI_MODELS.test(path);
  if (method !== 'POST') return false;
  return OPENAI_POST.test(path) || ANTHROPIC_POST.test(path) || GEMINI_POST.test(path) || ELEVENLABS_POST.test(path);
}
