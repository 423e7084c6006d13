import { BUILTIN_PROVIDERS } from './builtin.ts';
import { createOpenAICompatibleProvider } from './openai-compatible.ts';
import { routeMatchLength } from './route.ts';
import type { AuthStyle, ProviderModule } from './types.ts';

export type * from './types.ts';
export { createOpenAICompatibleProvider, isInjectedUsageChunk, requestStreamUsage } from './openai-compatible.ts';
export type { OpenAICompatibleOptions } from './openai-compatible.ts';
export { CREDENTIAL_HEADERS } from './auth.ts';
export {
  CHARACTERS_PER_TOKEN_ESTIMATE,
  estimateInputTokensFromRequest,
  estimateOutputTokensFromResponse,
  estimateTokensFromCharacters,
  isUsageBilledRequest,
} from './estimate.ts';
export { createSseReader } from './sse.ts';
export { anthropic } from './anthropic.ts';
export { google } from './google.ts';
export { elevenlabs } from './elevenlabs.ts';
export { demo, DEMO_MODEL } from './demo.ts';
export { BUILTIN_PROVIDERS } from './builtin.ts';

/** An operator-declared OpenAI-compatible service (a self-hosted vLLM, an internal proxy, …). */
export type CustomProviderConfig = {
  id: string;
  baseUrl: string;
  displayName?: string;
  authStyle?: AuthStyle;
  /** Set false if the service rejects `stream_options` (see OpenAICompatibleOptions). */
  acceptsStreamOptions?: boolean;
};

export type ProviderRegistry = {
  /** The provider that serves `url`, or null: the gateway forwards to nothing else. */
  findProvider(url: URL): ProviderModule | null;
  listProviders(): readonly ProviderModule[];
  getProvider(id: string): ProviderModule | null;
};

export class ProviderConfigError extends Error {}

const PROVIDER_ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/**
 * Built-in providers plus the operator's custom ones. Custom providers may live on private or
 * plain-http addresses: being declared by the operator is what puts them inside the SSRF wall.
 */
export function createRegistry(options: { custom?: readonly CustomProviderConfig[] } = {}): ProviderRegistry {
  const providers = [...BUILTIN_PROVIDERS];
  for (const config of options.custom ?? []) providers.push(customProvider(config, providers));
  Object.freeze(providers);
  const byId = new Map(providers.map((provider) => [provider.id, provider]));
  return {
    findProvider: (url) => bestMatch(providers, url),
    listProviders: () => providers,
    getProvider: (id) => byId.get(id) ?? null,
  };
}

/**
 * The longest matching base path wins, so `/v1beta/openai` beats Gemini's whole-host claim. On a
 * tie the later entry wins: a custom provider declared on a built-in's exact base is the
 * operator's explicit choice.
 */
function bestMatch(providers: readonly ProviderModule[], url: URL): ProviderModule | null {
  // user:password@ in a target would smuggle a credential of the caller's choosing upstream.
  if (url.username || url.password) return null;
  let best: ProviderModule | null = null;
  let bestLength = -1;
  for (const provider of providers) {
    const length = routeMatchLength(provider, url);
    if (length >= 0 && length >= bestLength) [best, bestLength] = [provider, length];
  }
  return best;
}

function customProvider(config: CustomProviderConfig, existing: readonly ProviderModule[]): ProviderModule {
  if (!PROVIDER_ID.test(config.id)) {
    throw new ProviderConfigError(`custom provider id "${config.id}" must be lower-case letters, digits, "-" or "_"`);
  }
  if (existing.some((provider) => provider.id === config.id)) {
    throw new ProviderConfigError(`custom provider id "${config.id}" is already taken`);
  }
  validateBaseUrl(config);
  return createOpenAICompatibleProvider({
    id: config.id,
    displayName: config.displayName ?? config.id,
    baseUrl: config.baseUrl,
    authStyle: config.authStyle ?? 'bearer',
    acceptsStreamOptions: config.acceptsStreamOptions ?? true,
    custom: true,
  });
}

/** A base with credentials, a query or a fragment cannot be matched or forwarded faithfully. */
function validateBaseUrl(config: CustomProviderConfig): void {
  let url: URL;
  try {
    url = new URL(config.baseUrl);
  } catch {
    throw new ProviderConfigError(`custom provider "${config.id}": baseUrl is not a URL`);
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') {
    throw new ProviderConfigError(`custom provider "${config.id}": baseUrl must be http or https`);
  }
  if (url.username || url.password || url.search || url.hash) {
    throw new ProviderConfigError(`custom provider "${config.id}": baseUrl must not carry credentials, a query or a fragment`);
  }
}

const defaultRegistry = createRegistry();

/** The built-in provider serving `url`, or null. Use createRegistry() to add custom providers. */
export function findProvider(url: URL): ProviderModule | null {
  return defaultRegistry.findProvider(url);
}

export function listProviders(): readonly ProviderModule[] {
  return defaultRegistry.listProviders();
}
