/** Where a provider lives: scheme, exact hosts and the path prefixes its module understands. */
export type ProviderRoute = {
  protocol: 'https:' | 'http:';
  hosts: readonly string[];
  basePaths: readonly string[];
};

/**
 * Derives a route from a documented base URL; `basePaths` overrides the base's own path for
 * providers that document more than one base on the same host.
 */
export function routeFromBaseUrl(baseUrl: string, basePaths?: readonly string[]): ProviderRoute {
  const url = new URL(baseUrl);
  if (url.protocol !== 'https:' && url.protocol !== 'http:') {
    throw new TypeError(`provider base URL must be http(s): ${baseUrl}`);
  }
  return {
    protocol: url.protocol,
    hosts: [url.host],
    basePaths: (basePaths ?? [url.pathname]).map(trimTrailingSlash),
  };
}

/**
 * Length of the base path under which `url` falls for this route, or -1 when it does not. The
 * length lets a registry prefer the most specific provider on a shared host.
 */
export function routeMatchLength(route: ProviderRoute, url: URL): number {
  if (url.protocol !== route.protocol || !route.hosts.includes(url.host)) return -1;
  let best = -1;
  for (const basePath of route.basePaths) {
    if (isPathUnder(url.pathname, basePath) && basePath.length > best) best = basePath.length;
  }
  return best;
}

/** Prefix match on whole segments: /v1beta/openai covers /v1beta/openai/x, not /v1beta/openaix. */
function isPathUnder(pathname: string, basePath: string): boolean {
  if (basePath === '') return true;
  return pathname === basePath || pathname.startsWith(`${basePath}/`);
}

function trimTrailingSlash(path: string): string {
  return path.replace(/\/+$/, '');
}

/**
 * A doubled API version at the start of a path, the client's own (the second) kept:
 * `/v1/v1/messages` → `/v1/messages`, `/v1beta/v1/models` → `/v1/models`. Clients append their
 * versioned paths to the base URL they are given, and the published client's bases carry a version.
 */
export function collapseDoubledVersion(pathname: string, versions: readonly string[]): string {
  const [, first, second] = pathname.split('/', 3);
  if (first === undefined || second === undefined || !versions.includes(first) || !versions.includes(second)) return pathname;
  return pathname.slice(first.length + 1);
}
