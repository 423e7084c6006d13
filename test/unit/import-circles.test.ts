import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { importCircles, importGraph, type ImportGraph } from '../helpers/import-circles.ts';
import { REPO_ROOT } from '../helpers/comment-references.ts';

/**
 * Files that import each other can only be read together, and a circle hides which layer owns
 * what (docs/architecture.md). No new circle may appear in src/. The circles left are listed
 * here, each with its files; the list only shrinks: a listed circle that is gone fails too, so
 * its entry is deleted with the fix.
 */
const ALLOWED_CIRCLES: string[][] = [
  // checkout.ts links a receipt; receipts.ts reads a checkout's purchase.
  ['commerce/checkout.ts', 'commerce/receipts.ts'],
  // batch-write.ts writes rollups; rollups.ts names the batch type; requests.ts uses both.
  ['storage/batch-write.ts', 'storage/requests.ts', 'storage/rollups.ts'],
  // db.ts's Storage names the replica; read-replica.ts builds the replica's Storage.
  ['storage/db.ts', 'storage/read-replica.ts'],
];

describe('import circles in src/', () => {
  it('has no import circle but the listed ones, and every listed one still exists', () => {
    const circles = importCircles(importGraph(join(REPO_ROOT, 'src')));
    expect(circles).toEqual([...ALLOWED_CIRCLES].sort((a, b) => a[0]!.localeCompare(b[0]!)));
  });
});

describe('the circle finder itself', () => {
  const graphOf = (edges: Record<string, string[]>): ImportGraph => new Map(Object.entries(edges));

  it('finds a two-file circle, a longer one and a self-import, and nothing in a tree', () => {
    const graph = graphOf({
      'a.ts': ['b.ts'],
      'b.ts': ['a.ts', 'c.ts'],
      'c.ts': ['d.ts'],
      'd.ts': ['e.ts'],
      'e.ts': ['c.ts'],
      'f.ts': ['f.ts'],
      'g.ts': ['a.ts', 'h.ts'],
      'h.ts': [],
    });
    expect(importCircles(graph)).toEqual([['a.ts', 'b.ts'], ['c.ts', 'd.ts', 'e.ts'], ['f.ts']]);
    expect(importCircles(graphOf({ 'a.ts': ['b.ts', 'c.ts'], 'b.ts': ['c.ts'], 'c.ts': [] }))).toEqual([]);
  });

  it('reads type imports, re-exports and dynamic imports of a real folder as edges', () => {
    const graph = importGraph(join(REPO_ROOT, 'src'));
    // app.ts imports the forward gateway; the CLI reaches main.ts only through await import().
    expect(graph.get('app.ts')).toContain('gateway/forward.ts');
    expect(graph.get('cli/index.ts')).toContain('main.ts');
  });
});
