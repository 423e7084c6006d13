/**
 * Where a rewrite call goes. A client SDK given `/v1/rewrite/<format>/<provider base>` as its base
 * URL appends its own path, and SDKs differ in what they append: `/v1/messages` (@anthropic-ai/sdk)
 * or `/messages` (@ai-sdk/anthropic), `/chat/completions` or `/responses` (OpenAI clients),
 * `/v1/models/…` or `/v1beta/models/…` (@google/genai, by API version). Users write the provider
 * base with or without its version and with trailing slashes. So the client's path is taken off,
 * what is left is matched against the provider's own base paths (any API-version segments left
 * over are the client's, not the provider's), and the provider's endpoint is written under the
 * provider's real base. Decision 0022 has the rules.
 */
import { ApiError } from '../../http/errors.ts';
import type { ProviderModule, ProviderRegistry } from '../../providers/index.ts';
import type { ClientApi, RewriteFormat } from './canonical.ts';

/** What the client's own path said: which API it speaks, and for Gemini clients the model and method. */
export type ClientCall = { api: ClientApi; base: URL; model: string; stream: boolean; appended: boolean };

/** The path each client API appends to its base URL; taken off to find the provider's base. */
const CLIENT_PATHS: Record<RewriteFormat, readonly { api: ClientApi; suffix: RegExp }[]> = {
  openai: [
    { api: 'openai', suffix: /\/chat\/completions\/*$/ },
    { api: 'responses', suffix: /\/responses\/*$/ },
  ],
  anthropic: [{ api: 'anthropic', suffix: /(?:\/v1)?\/messages\/*$/ }],
  google: [{ api: 'google', suffix: /(?:\/v1(?:beta|alpha)?)?\/models\/([^/:]+):(generateContent|streamGenerateContent)$/ }],
};

/** The provider's own chat endpoint, when the URL already names it (`gateway(url, {format})`). */
const PROVIDER_ENDPOINT: Record<RewriteFormat, RegExp> = {
  openai: /\/chat\/completions$/,
  anthropic: /\/messages$/,
  google: /\/models\/([^/:]+):(?:generateContent|streamGenerateContent)$/,
};

/** The API versions client SDKs put into their paths (and users into base URLs): v1, v1beta, v1alpha. */
const VERSION_SEGMENT = /^v1(?:alpha|beta)?$/;
const GEMINI_DEFAULT_VERSION = 'v1beta';

/** The client's API and the provider base its path leaves; a path the client format does not append leaves the URL whole. */
export function clientCallOf(format: RewriteFormat, url: URL): ClientCall {
  const base = new URL(url);
  base.search = '';
  for (const { api, suffix } of CLIENT_PATHS[format]) {
    const match = suffix.exec(base.pathname);
    if (!match) continue;
    base.pathname = base.pathname.slice(0, match.index) || '/';
    if (api !== 'google') return { api, base, model: '', stream: false, appended: true };
    return { api, base, model: decodeURIComponent(match[1]!), stream: match[2] === 'streamGenerateContent', appended: true };
  }
  return { api: CLIENT_PATHS[format][0]!.api, base, model: '', stream: false, appended: false };
}

/**
 * The provider serving a base URL: the registry's match, or — for a base written without the
 * provider's base path (`https://api.openai.com`, `https://api.groq.com/v1beta`) — the one
 * provider on that host.
 */
export function providerOfBase(registry: ProviderRegistry, base: URL): ProviderModule | null {
  const matched = registry.findProvider(base);
  if (matched) return matched;
  const onHost = registry.listProviders().filter((p) => p.protocol === base.protocol && p.hosts.includes(base.host));
  return onHost.length === 1 ? onHost[0]! : null;
}

/**
 * The provider's chat endpoint for this call: the URL's own when it names one, else the provider's
 * endpoint under its real base. Gemini's endpoint also names the model and the method, and keeps
 * the API version the provider base named (v1beta when it named none).
 */
export function providerEndpoint(format: RewriteFormat, provider: ProviderModule, call: ClientCall, model: string, stream: boolean): string {
  const url = new URL(call.base);
  const named = PROVIDER_ENDPOINT[format].exec(url.pathname);
  if (format === 'openai') url.pathname = named ? url.pathname : `${providerBase(provider, url).path}/chat/completions`;
  if (format === 'anthropic') url.pathname = named ? url.pathname : `${providerBase(provider, url).path}/messages`;
  if (format === 'google') {
    const chosen = named ? decodeURIComponent(named[1]!) : model;
    if (!chosen) throw new ApiError('validation_error', 'model is required.', { issues: [{ path: ['model'], message: 'is required' }] });
    const prefix = named ? url.pathname.slice(0, named.index) : geminiPrefix(providerBase(provider, url));
    url.pathname = `${prefix}/models/${encodeURIComponent(chosen)}:${stream ? 'streamGenerateContent' : 'generateContent'}`;
    url.search = stream ? '?alt=sse' : '';
  }
  return url.toString();
}

/** The endpoint of each client API that is not Gemini's (whose URL carries its own model, method and version). */
const OWN_ENDPOINT: Partial<Record<ClientApi, string>> = { openai: '/chat/completions', responses: '/responses', anthropic: '/messages' };

/**
 * Same format on both sides, nothing translated: the client's own endpoint under the provider's
 * real base, so `…/rewrite/openai/https://api.openai.com` + `/chat/completions` reaches
 * `/v1/chat/completions`. Any other path (`/v1/embeddings`, `…/messages/count_tokens`) and a
 * Gemini URL (the provider module reads doubled versions) go as given. `query` is the provider's:
 * `alt=sse` must reach Gemini.
 */
export function ownEndpoint(provider: ProviderModule, call: ClientCall, url: URL, query: URLSearchParams): string {
  const path = OWN_ENDPOINT[call.api];
  const own = new URL(url);
  if (path && call.appended) {
    own.pathname = `${providerBase(provider, call.base).path}${path}`;
  }
  own.search = query.toString();
  return own.toString();
}

type ProviderBase = { path: string; versions: string[] };

/**
 * The provider's base path that the URL's path is written from, and the API versions after it.
 * `/v1`, `/v1/`, `/v1/v1` (a client's version after the user's) are OpenAI's `/v1`; `` and
 * `/v1beta` under OpenAI's host are its documented base; anything else is not this provider's base.
 */
function providerBase(provider: ProviderModule, url: URL): ProviderBase {
  const path = url.pathname.replace(/\/+$/, '');
  const longestFirst = [...provider.basePaths].sort((a, b) => b.length - a.length);
  for (const basePath of longestFirst) {
    if (path !== basePath && !path.startsWith(`${basePath}/`)) continue;
    const versions = path.slice(basePath.length).split('/').filter(Boolean);
    if (versions.every((segment) => VERSION_SEGMENT.test(segment))) return { path: basePath, versions };
  }
  const segments = path.split('/').filter(Boolean);
  if (segments.every((segment) => VERSION_SEGMENT.test(segment))) {
    return { path: new URL(provider.baseUrl).pathname.replace(/\/+$/, ''), versions: segments };
  }
  throw new ApiError('unsupported_provider', `${url.host}${url.pathname} is not a base URL of ${provider.displayName}; use ${provider.baseUrl}.`);
}

/** Gemini's API version lives in the path: the provider base's own, else v1beta. */
function geminiPrefix(base: ProviderBase): string {
  return `${base.path}/${base.versions[0] ?? GEMINI_DEFAULT_VERSION}`;
}
