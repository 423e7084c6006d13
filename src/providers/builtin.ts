import { anthropic } from './anthropic.ts';
import { demo } from './demo.ts';
import { elevenlabs } from './elevenlabs.ts';
import { google } from './google.ts';
import { createOpenAICompatibleProvider, type OpenAICompatibleOptions } from './openai-compatible.ts';
import type { ProviderModule } from './types.ts';

/**
 * The OpenAI-compatible providers of the official client's `providers` map (SDK 11.2). Ids are the
 * SDK's keys, lower-cased; base URLs are the SDK's, so `providers.<key>` + a path always matches.
 * `basePaths` is given only where a provider documents more than its SDK base on the same host.
 */
const OPENAI_COMPATIBLE: readonly OpenAICompatibleOptions[] = [
  {
    id: 'openai',
    displayName: 'OpenAI',
    baseUrl: 'https://api.openai.com/v1',
    modelNames: /^(gpt-|o\d|chatgpt-|text-embedding-(3|ada)|davinci|babbage|omni-moderation|tts-|whisper-|dall-e)/,
  },
  {
    id: 'google-openai',
    displayName: 'Google Gemini (OpenAI-compatible)',
    baseUrl: 'https://generativelanguage.googleapis.com/v1beta/openai',
    // Gemini's OpenAI-compatible path: the drop-in endpoints' route to Gemini models, on Google's account.
    modelNames: /^(gemini-|text-embedding-00|gemma-)/,
    sharesAccountWith: 'google',
  },
  { id: 'mistral', displayName: 'Mistral AI', baseUrl: 'https://api.mistral.ai/v1', modelNames: /^(mistral-|codestral|ministral|pixtral|open-mistral|magistral)/ },
  // DeepSeek documents https://api.deepseek.com (no /v1) as its primary base.
  { id: 'deepseek', displayName: 'DeepSeek', baseUrl: 'https://api.deepseek.com/v1', basePaths: ['/'], modelNames: /^deepseek-/ },
  { id: 'xai', displayName: 'xAI', baseUrl: 'https://api.x.ai/v1', modelNames: /^grok-/ },
  { id: 'kluster', displayName: 'kluster.ai', baseUrl: 'https://api.kluster.ai/v1' },
  { id: 'inference', displayName: 'Inference.net', baseUrl: 'https://api.inference.net/v1' },
  { id: 'groq', displayName: 'Groq', baseUrl: 'https://api.groq.com/openai/v1' },
  // Novita's newer docs use /openai; the SDK still points at /v3/openai.
  { id: 'novita', displayName: 'Novita AI', baseUrl: 'https://api.novita.ai/v3/openai', basePaths: ['/v3/openai', '/openai'] },
  { id: 'vercel', displayName: 'Vercel v0', baseUrl: 'https://api.v0.dev/v1' },
  { id: 'together', displayName: 'Together AI', baseUrl: 'https://api.together.xyz/v1' },
  { id: 'hyperbolic', displayName: 'Hyperbolic', baseUrl: 'https://api.hyperbolic.xyz/v1' },
  { id: 'sambanova', displayName: 'SambaNova', baseUrl: 'https://api.sambanova.ai/v1' },
  { id: 'deepinfra', displayName: 'DeepInfra', baseUrl: 'https://api.deepinfra.com/v1/openai' },
  // Only the compatibility API: Cohere's native /v1 and /v2 report usage in another shape.
  { id: 'cohere', displayName: 'Cohere (OpenAI-compatible)', baseUrl: 'https://api.cohere.ai/compatibility/v1', modelNames: /^(command|embed-)/ },
  { id: 'parasail', displayName: 'Parasail', baseUrl: 'https://api.parasail.io/v1' },
  { id: 'nebius', displayName: 'Nebius AI Studio', baseUrl: 'https://api.studio.nebius.com/v1' },
  { id: 'fireworks', displayName: 'Fireworks AI', baseUrl: 'https://api.fireworks.ai/inference/v1' },
  { id: 'embercloud', displayName: 'EmberCloud', baseUrl: 'https://api.embercloud.ai/v1' },
  { id: 'cerebras', displayName: 'Cerebras', baseUrl: 'https://api.cerebras.ai/v1' },
  { id: 'targon', displayName: 'Targon', baseUrl: 'https://api.targon.com/v1' },
  { id: 'gmicloud', displayName: 'GMI Cloud', baseUrl: 'https://api.gmi-serving.com/v1' },
  { id: 'chutes', displayName: 'Chutes', baseUrl: 'https://llm.chutes.ai/v1' },
  { id: 'baseten', displayName: 'Baseten', baseUrl: 'https://inference.baseten.co/v1' },
  { id: 'moonshot', displayName: 'Moonshot AI', baseUrl: 'https://api.moonshot.ai/v1', modelNames: /^(kimi-|moonshot-)/ },
];

/**
 * All built-in providers: 25 OpenAI-compatible plus the three with their own wire formats, and the
 * offline demo (OpenAI-shaped, answered in process).
 */
export const BUILTIN_PROVIDERS: readonly ProviderModule[] = [
  ...OPENAI_COMPATIBLE.map(createOpenAICompatibleProvider),
  anthropic,
  google,
  elevenlabs,
  demo,
];
