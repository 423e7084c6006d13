import { isIPv4 } from 'node:net';
import { ApiError } from '../http/errors.ts';
import type { ProviderModule, ProviderRegistry } from '../providers/index.ts';

/**
 * The forward target: which URL `/v1/forward?u=<target>` names, and whether Tollgate may call it.
 * Pure (no DNS, no network): the SSRF wall is "known provider host, by name", so nothing here
 * depends on what a name resolves to.
 */

export type ForwardQuery = {
  /** The target URL as given (decoded when `u` was percent-encoded); null when `u` is absent or empty. */
  target: string | null;
  /** Tollgate's own query parameters (`metadata`, `key`, …): every parameter that is not the target. */
  params: URLSearchParams;
};

export type ResolvedTarget = {
  /** The provider URL the client named, normalised, without `key` and without a fragment. */
  publicUrl: URL;
  /** Where the request really goes: publicUrl, or its UPSTREAM_OVERRIDES mapping. */
  upstreamUrl: URL;
  provider: ProviderModule;
  /** The `key` query parameter of the target (Google-style credential placement), removed from both URLs. */
  strippedKey: string | null;
};

/** A value that starts with a scheme and `://` (unencoded) is a raw URL; see splitForwardQuery. */
const RAW_TARGET = /^[a-z][a-z0-9+.-]*:\/\//i;

/**
 * Splits the request's query string into the forward target and Tollgate's own parameters.
 *
 * Clients send `u` in two ways:
 * - **encoded** (`u=https%3A%2F%2Fapi.openai.com%2Fv1%2Fmodels%3Fa%3D1`, what `encodeURIComponent`,
 *   the official client's `gateway()` and Stainless clients that re-serialise their base URL's query
 *   produce): standard form parsing; `u`'s value is decoded and parameters on both sides of it are
 *   Tollgate's (`key`, `metadata`) or the provider's (every other one).
 * - **raw** (`u=https://api.openai.com/v1/models?a=1&b=2`, what the official client's
 *   `providers.*` URLs produce by concatenation): the value after `u=` starts with a scheme and an
 *   unencoded `://`. The target is everything after `u=` up to the end of the query string (its own
 *   `?`, `&` and percent-escapes belong to it), except Tollgate's own parameters (`key`,
 *   `metadata`), which are always Tollgate's wherever they stand. A raw target without a `?` ends
 *   at its first `&`: `u=https://api.anthropic.com/v1/messages&key=…` names /v1/messages.
 *
 * `path` is what followed `/v1/forward` in the request path (`/chat/completions` when a client
 * appended its path to a base URL that is the forward URL): it is joined to the target's path.
 *
 * The provider's parameters of both sides end in the target's query, each name=value pair once
 * (a client that puts `alt=sse` both into u and beside it sends it once).
 * The first `u` names the target; a later `u` (encoded mode only) is left in `params`.
 * Names and values in `params` are form-decoded (`+` is a space), as URLSearchParams does.
 */
export function splitForwardQuery(rawUrl: string, path = ''): ForwardQuery {
  const params = new URLSearchParams();
  const queryStart = rawUrl.indexOf('?');
  if (queryStart === -1) return { target: null, params };
  const query = rawUrl.slice(queryStart + 1);

  let target: string | null = null;
  const passThrough: string[] = [];
  const takeSegment = (segment: string) => {
    if (segment === '') return;
    const equals = segment.indexOf('=');
    const name = formDecode(equals === -1 ? segment : segment.slice(0, equals));
    if (TOLLGATE_PARAMS.has(name)) params.append(name, formDecode(equals === -1 ? '' : segment.slice(equals + 1)));
    else passThrough.push(segment);
  };
  let position = 0;
  while (position <= query.length) {
    const ampersand = query.indexOf('&', position);
    const end = ampersand === -1 ? query.length : ampersand;
    const segment = query.slice(position, end);
    const equals = segment.indexOf('=');
    const name = formDecode(equals === -1 ? segment : segment.slice(0, equals));
    const value = equals === -1 ? '' : segment.slice(equals + 1);

    if (name === 'u' && target === null) {
      if (RAW_TARGET.test(value)) {
        const raw = splitRawTarget(query.slice(position + equals + 1));
        target = raw.target;
        for (const rawSegment of raw.query) takeSegment(rawSegment);
        break;
      }
      target = formDecode(value);
    } else if (name === 'u') {
      params.append(name, formDecode(value));
    } else {
      takeSegment(segment);
    }
    if (ampersand === -1) break;
    position = ampersand + 1;
  }
  if (!target) return { target: null, params };
  return { target: withQuery(joinPath(target, path), passThrough), params };
}

/** A raw target: the URL up to its query, and its query's segments (after its `?`, or its first `&`). */
function splitRawTarget(raw: string): { target: string; query: string[] } {
  const question = raw.indexOf('?');
  const cut = question === -1 ? raw.indexOf('&') : question;
  if (cut === -1) return { target: raw, query: [] };
  return { target: raw.slice(0, cut), query: raw.slice(cut + 1).split('&') };
}

/**
 * The target with `path` appended to its path (before its query). The URL is parsed and its path
 * set through the pathname setter, so nothing in `path` can change the host; a target that does
 * not parse is returned as it is, for resolveTarget to refuse.
 */
function joinPath(target: string, path: string): string {
  if (path === '' || path === '/') return target;
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    return target;
  }
  url.hash = '';
  url.pathname = url.pathname.replace(/\/+$/, '') + (path.startsWith('/') ? path : `/${path}`);
  return url.href;
}

/** Appends query segments to a target, leaving out every name=value pair it already has. */
function withQuery(target: string, segments: readonly string[]): string {
  if (segments.length === 0) return target;
  const question = target.indexOf('?');
  const existing = question === -1 ? [] : target.slice(question + 1).split('&');
  const seen = new Set(existing.map(pairKey));
  const added: string[] = [];
  for (const segment of segments) {
    const key = pairKey(segment);
    if (seen.has(key)) continue;
    seen.add(key);
    added.push(segment);
  }
  if (added.length === 0) return target;
  const separator = question === -1 ? '?' : target.endsWith('?') || target.endsWith('&') ? '' : '&';
  return target + separator + added.join('&');
}

/** A query segment's decoded name and value, to compare `alt=sse` with `alt=%73se`. */
function pairKey(segment: string): string {
  const equals = segment.indexOf('=');
  return equals === -1 ? `${formDecode(segment)}\n` : `${formDecode(segment.slice(0, equals))}\n${formDecode(segment.slice(equals + 1))}`;
}

/** Query parameters that are Tollgate's own on /v1/forward; every other one is the provider's. */
const TOLLGATE_PARAMS = new Set(['metadata', 'key']);

/** application/x-www-form-urlencoded decoding, lenient about malformed escapes (as URLSearchParams is). */
function formDecode(text: string): string {
  return new URLSearchParams(`v=${text.replaceAll('&', '%26')}`).get('v') ?? '';
}

/**
 * Parses and checks a forward target, and works out where the request really goes.
 *
 * Refused with `unsupported_provider` (400): anything that is not an absolute http(s) URL; userinfo
 * (`https://api.openai.com@evil.example` names the host evil.example); IP-literal hosts in any
 * spelling (WHATWG parsing turns `2130706433`, `0x7f.1` and `127.1` into `127.0.0.1`, so the check
 * runs on the parsed host); `localhost` and `*.localhost`; and any URL the registry does not match
 * (exact host and port, scheme and base path: built-ins are https only).
 *
 * Custom providers are the operator's own declarations (ADR 0003): a target that matches one is
 * allowed whatever its host, so `http://10.0.0.5:8000/v1` works when the operator declared exactly
 * that base. Everything else reaches loopback or private addresses only through `overrides`.
 *
 * `overrides` maps a provider host (`URL.host`, lower case) to the base URL that really serves it:
 * scheme, host, port and base path of the upstream URL are the override's, followed by the target's
 * path and query (e.g. `api.openai.com` → `http://127.0.0.1:PORT` in tests).
 */
export function resolveTarget(
  target: string,
  registry: Pick<ProviderRegistry, 'findProvider'>,
  overrides: Readonly<Record<string, string>>,
): ResolvedTarget {
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    throw refuse('The forward target (u) must be an absolute https URL of a supported provider.');
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') {
    throw refuse(`The forward target must use https, not ${url.protocol.slice(0, -1)}.`);
  }
  if (url.username !== '' || url.password !== '') {
    throw refuse('The forward target must not contain a user name or password.');
  }
  // WHATWG parsing already lowercased the host, decoded %-escapes in it, mapped IDNs to punycode
  // and rewrote numeric IPv4 forms; a single trailing dot names the same host.
  if (url.hostname.endsWith('.') && url.hostname.length > 1) url.hostname = url.hostname.slice(0, -1);
  url.hash = '';
  const strippedKey = removeKeyParameter(url);

  let provider = registry.findProvider(url);
  const canonical = provider?.canonicalPath?.(url.pathname);
  if (provider && canonical !== undefined && canonical !== url.pathname) {
    url.pathname = canonical;
    provider = registry.findProvider(url);
  }
  if (provider?.custom !== true && isAddressOrLocalName(url.hostname)) {
    throw refuse(`The forward target host ${url.hostname} is an IP address or a local name; only provider hosts are allowed.`);
  }
  if (!provider) {
    if (url.protocol === 'http:' && registry.findProvider(withProtocol(url, 'https:'))) {
      throw refuse(`The forward target must use https: ${url.host} is only reachable over https.`);
    }
    throw refuse(`The forward target ${url.host}${url.pathname} is not a supported provider URL.`);
  }

  return { publicUrl: url, upstreamUrl: applyOverride(url, overrides), provider, strippedKey };
}

function refuse(message: string): ApiError {
  return new ApiError('unsupported_provider', message);
}

/** IPv4 (already in dotted form after parsing), bracketed IPv6, and loopback names. */
function isAddressOrLocalName(hostname: string): boolean {
  return (
    isIPv4(hostname) ||
    hostname.startsWith('[') ||
    hostname === 'localhost' ||
    hostname.endsWith('.localhost')
  );
}

function withProtocol(url: URL, protocol: 'https:'): URL {
  const copy = new URL(url);
  copy.protocol = protocol;
  return copy;
}

/**
 * Removes every `key` parameter from the URL's query and returns the first value (null when absent
 * or empty). The other parameters keep their exact bytes: re-serialising through searchParams
 * would re-encode them (`a:b` → `a%3Ab`, `%20` → `+`).
 */
function removeKeyParameter(url: URL): string | null {
  if (url.search === '') return null;
  let key: string | null = null;
  const kept: string[] = [];
  for (const segment of url.search.slice(1).split('&')) {
    const equals = segment.indexOf('=');
    if (formDecode(equals === -1 ? segment : segment.slice(0, equals)) === 'key') {
      key ??= equals === -1 ? '' : formDecode(segment.slice(equals + 1));
    } else {
      kept.push(segment);
    }
  }
  if (key === null) return null;
  url.search = kept.filter((segment) => segment !== '').join('&');
  return key === '' ? null : key;
}

/**
 * The upstream URL: the override's origin and base path, then the target's path and query. The
 * path is set through the pathname setter, never by string concatenation, so a target path such
 * as `//evil.example/x` stays a path and cannot become a protocol-relative URL.
 */
function applyOverride(publicUrl: URL, overrides: Readonly<Record<string, string>>): URL {
  const base = overrideFor(publicUrl.host, overrides);
  if (base === undefined) return new URL(publicUrl);
  let upstream: URL;
  try {
    upstream = new URL(base);
  } catch {
    throw new Error(`UPSTREAM_OVERRIDES: the base URL for ${publicUrl.host} is not a URL`);
  }
  if (upstream.protocol !== 'https:' && upstream.protocol !== 'http:') {
    throw new Error(`UPSTREAM_OVERRIDES: the base URL for ${publicUrl.host} must be http or https`);
  }
  upstream.pathname = upstream.pathname.replace(/\/+$/, '') + publicUrl.pathname;
  upstream.search = publicUrl.search;
  upstream.hash = '';
  return upstream;
}

function overrideFor(host: string, overrides: Readonly<Record<string, string>>): string | undefined {
  if (Object.hasOwn(overrides, host)) return overrides[host];
  for (const [key, value] of Object.entries(overrides)) {
    if (key.toLowerCase().replace(/\.$/, '') === host) return value;
  }
  return undefined;
}
