/**
 * Small readers for untrusted JSON. Provider responses are never trusted to have the documented
 * shape, so every read checks its type and a wrong type reads as "absent".
 */

export type JsonObject = Record<string, unknown>;

export function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function objectAt(value: unknown, key: string): JsonObject | undefined {
  if (!isObject(value)) return undefined;
  const child = value[key];
  return isObject(child) ? child : undefined;
}

export function arrayAt(value: unknown, key: string): unknown[] | undefined {
  if (!isObject(value)) return undefined;
  const child = value[key];
  return Array.isArray(child) ? child : undefined;
}

export function stringAt(value: unknown, key: string): string | undefined {
  if (!isObject(value)) return undefined;
  const child = value[key];
  return typeof child === 'string' ? child : undefined;
}

/** A count: finite and not negative. Anything else (strings, NaN, -1) reads as absent. */
export function countAt(value: unknown, key: string): number | undefined {
  if (!isObject(value)) return undefined;
  const child = value[key];
  return typeof child === 'number' && Number.isFinite(child) && child >= 0 ? child : undefined;
}

/** Parses an SSE data payload; undefined for anything that is not JSON. */
export function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** The first non-empty string among the candidates. */
export function firstString(...candidates: (string | undefined)[]): string | null {
  for (const candidate of candidates) if (candidate) return candidate;
  return null;
}

/** The body's own `stream: true` (OpenAI-compatible, Anthropic and ElevenLabs requests). */
export function streamFlagSet(body: unknown): boolean {
  return isObject(body) && body.stream === true;
}
