import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { EVENT_TYPES } from '../../src/webhooks/events.ts';

const text = readFileSync(new URL('../../docs/webhooks.md', import.meta.url), 'utf8');

/** The JSON example blocks under one `### \`name\`` heading. */
function examplesOf(name: string): unknown[] {
  const start = text.indexOf(`### \`${name}\``);
  if (start < 0) return [];
  const next = text.indexOf('\n## ', start + 1);
  const nextEvent = text.indexOf('\n### ', start + 1);
  const end = Math.min(...[next, nextEvent, text.length].filter((i) => i > 0));
  const section = text.slice(start, end);
  return [...section.matchAll(/```json\n([\s\S]*?)```/g)].map((m) => JSON.parse(m[1]!));
}

describe('docs/webhooks.md', () => {
  it.each(EVENT_TYPES)('documents %s with a payload example in the delivered shape', (name) => {
    const examples = examplesOf(name);
    expect(examples.length, `no JSON example under ### \`${name}\``).toBeGreaterThan(0);
    for (const example of examples) {
      expect(Object.keys(example as object)).toEqual(['id', 'event', 'created_at', 'data']);
      expect(example).toMatchObject({ event: name });
    }
  });
});
