/** Timestamps are stored as ISO-8601 UTC strings with milliseconds, which sort as text. */
export function nowIso(): string {
  return new Date().toISOString();
}
