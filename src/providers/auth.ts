import type { AuthStyle, HeaderTarget } from './types.ts';

/**
 * Every header a provider credential can travel in. Clearing all of them before setting our own
 * means exactly one credential reaches the provider: the one the gateway chose.
 */
export const CREDENTIAL_HEADERS = ['authorization', 'x-api-key', 'x-goog-api-key', 'xi-api-key'] as const;

const HEADER_OF_STYLE: Record<AuthStyle, string> = {
  bearer: 'authorization',
  'x-api-key': 'x-api-key',
  'x-goog-api-key': 'x-goog-api-key',
  'xi-api-key': 'xi-api-key',
};

/**
 * Sets `key` in the header of `style` and removes the other credential headers. Headers that are
 * not credentials (anthropic-version, anthropic-beta, content-type, …) are left untouched.
 */
export function applyKey(headers: HeaderTarget, style: AuthStyle, key: string): void {
  for (const name of CREDENTIAL_HEADERS) deleteHeader(headers, name);
  const value = style === 'bearer' ? `Bearer ${key}` : key;
  setHeader(headers, HEADER_OF_STYLE[style], value);
}

function deleteHeader(headers: HeaderTarget, name: string): void {
  if (headers instanceof Headers) {
    headers.delete(name);
    return;
  }
  // Plain records may hold the same header under several spellings ("Authorization", "authorization").
  for (const existing of Object.keys(headers)) {
    if (existing.toLowerCase() === name) delete headers[existing];
  }
}

function setHeader(headers: HeaderTarget, name: string, value: string): void {
  if (headers instanceof Headers) headers.set(name, value);
  else headers[name] = value;
}
