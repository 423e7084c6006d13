import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { jsonNestsDeeperThan } from '../../src/http/json-depth.ts';
import { findNul } from '../../src/http/nul-characters.ts';

/** The nesting depth of a JSON value, counted the way the text scanner counts brackets. */
function depthOf(value: unknown): number {
  if (value === null || typeof value !== 'object') return 0;
  const children = Array.isArray(value) ? value : Object.values(value);
  return 1 + children.reduce<number>((max, child) => Math.max(max, depthOf(child)), 0);
}

describe('JSON depth and NUL walks', () => {
  it('the text scan agrees with the parsed value on depth, whatever the strings hold', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 8 }), fc.integer({ min: 0, max: 9 }), (value, max) => {
        expect(jsonNestsDeeperThan(JSON.stringify(value), max)).toBe(depthOf(value) > max);
      }),
      { numRuns: 2_000 },
    );
  });

  it('finds a NUL 200,000 levels down without running out of stack, and names its path', () => {
    let value: unknown = { leaf: 'x\u0000' };
    for (let i = 0; i < 200_000; i++) value = [value];
    const path = findNul(value, ['body']);
    expect(path).toHaveLength(1 + 200_000 + 1);
    expect(path?.at(-1)).toBe('leaf');
  });

  it('names the first NUL in document order, keys included', () => {
    expect(findNul({ a: ['ok', { 'b\u0000': 1 }], c: 'x\u0000' }, [])).toEqual(['a', '1', 'b\u0000']);
    expect(findNul({ a: ['ok', 'y\u0000'], c: 'x\u0000' }, [])).toEqual(['a', '1']);
    expect(findNul({ a: ['ok'] }, [])).toBeNull();
  });
});
