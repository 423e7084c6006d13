import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

/**
 * The import graph of a source tree and its circles. Every import counts — `import type`,
 * re-exports and `await import(…)` too: a reader follows a type into its file as much as a call.
 * Only relative imports are followed; packages are outside the tree.
 */
export type ImportGraph = Map<string, string[]>;

/** Each `.ts` file under `root` (paths relative to `root`) and the files of the tree it imports. */
export function importGraph(root: string): ImportGraph {
  const files = readdirSync(root, { recursive: true, encoding: 'utf8' })
    .filter((name) => name.endsWith('.ts') && !name.endsWith('.d.ts'))
    .map((name) => name.split('\\').join('/'));
  const known = new Set(files);
  const graph: ImportGraph = new Map();
  for (const file of files) {
    const specifiers = ts.preProcessFile(readFileSync(join(root, file), 'utf8'), true, true).importedFiles.map((f) => f.fileName);
    const targets = specifiers
      .filter((specifier) => specifier.startsWith('.'))
      .map((specifier) => relative(root, resolve(root, dirname(file), specifier)).split('\\').join('/'))
      .filter((target) => known.has(target));
    graph.set(file, [...new Set(targets)].sort());
  }
  return graph;
}

/**
 * The circles of a graph: its strongly connected components of more than one file (or a file
 * importing itself), each as its sorted file list, the list sorted by first file. Tarjan's
 * algorithm, iterative so a deep tree cannot overflow the stack.
 */
export function importCircles(graph: ImportGraph): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const circles: string[][] = [];
  let next = 0;
  for (const start of graph.keys()) {
    if (index.has(start)) continue;
    const work: { node: string; edge: number }[] = [{ node: start, edge: 0 }];
    index.set(start, next);
    low.set(start, next++);
    stack.push(start);
    onStack.add(start);
    while (work.length > 0) {
      const frame = work[work.length - 1]!;
      const targets = graph.get(frame.node) ?? [];
      if (frame.edge < targets.length) {
        const target = targets[frame.edge++]!;
        if (!index.has(target)) {
          index.set(target, next);
          low.set(target, next++);
          stack.push(target);
          onStack.add(target);
          work.push({ node: target, edge: 0 });
        } else if (onStack.has(target)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(target)!));
        }
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!));
      if (low.get(frame.node) !== index.get(frame.node)) continue;
      const component: string[] = [];
      let member: string;
      do {
        member = stack.pop()!;
        onStack.delete(member);
        component.push(member);
      } while (member !== frame.node);
      const selfImport = component.length === 1 && targets.includes(frame.node);
      if (component.length > 1 || selfImport) circles.push(component.sort());
    }
  }
  return circles.sort((a, b) => a[0]!.localeCompare(b[0]!));
}
