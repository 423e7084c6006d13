import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import type { Reporter, TestModule } from 'vitest/node';
import { installedMajor, renderClientMatrix, type CoveredTest } from '../helpers/client-matrix.ts';

/**
 * Renders docs/clients.md from the client e2e tests of a run (see test/helpers/client-matrix.ts)
 * and fails the run when the file differs, so the table cannot drift from what the tests prove.
 * With UPDATE_CLIENT_DOCS=1 (`npm run docs:clients`) it writes the file instead.
 *
 * It runs in vitest's main process after every worker finished, so parallel workers need no
 * coordination. It checks only a run that executed every declaring file in full: a run of some
 * files, or one filtered with -t, proves only part of the table and is left alone.
 */
const ROOT = join(import.meta.dirname, '..', '..');
const DOC = join(ROOT, 'docs', 'clients.md');
const E2E = join(ROOT, 'test', 'e2e');

export default class ClientMatrixReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const declaring = declaringFiles();
    const ran = new Map(testModules.map((m) => [m.moduleId, m]));
    if (declaring.length === 0 || !declaring.every((file) => ran.has(file))) return;

    const tests: CoveredTest[] = [];
    for (const file of declaring) {
      for (const test of ran.get(file)!.children.allTests()) {
        const meta = test.meta();
        const coverage = meta.clientCoverage;
        if (!coverage) continue;
        const state = test.result().state;
        if (test.options.mode === 'todo') tests.push({ coverage, outcome: 'todo', todo: meta.clientCoverageTodo ?? 'not written yet' });
        else if (state === 'passed' || state === 'failed') tests.push({ coverage, outcome: state });
        // Skipped by a filter, or not finished (an interrupted run): this run does not prove the table.
        else return;
      }
    }
    if (tests.some((t) => t.outcome === 'failed')) {
      console.error('\ndocs/clients.md not checked: client e2e tests failed (see above).');
      return;
    }
    const rendered = renderClientMatrix(tests, (pkg) => installedMajor(ROOT, pkg));
    if (process.env.UPDATE_CLIENT_DOCS) {
      writeFileSync(DOC, rendered);
      console.log(`\nWrote ${relative(ROOT, DOC)} from ${tests.length} client tests.`);
      return;
    }
    let current = '';
    try {
      current = readFileSync(DOC, 'utf8');
    } catch {
      // missing: reported below as differing
    }
    if (current !== rendered) {
      console.error(`\n${relative(ROOT, DOC)} differs from what this run's client tests prove; run \`npm run docs:clients\` and commit it.`);
      console.error(firstDifference(current, rendered));
      process.exitCode = 1;
    }
  }
}

/** The e2e test files that declare client coverage. */
function declaringFiles(): string[] {
  return readdirSync(E2E)
    .filter((name) => name.endsWith('.test.ts'))
    .map((name) => join(E2E, name))
    .filter((file) => readFileSync(file, 'utf8').includes('covers('));
}

function firstDifference(current: string, rendered: string): string {
  const a = current.split('\n');
  const b = rendered.split('\n');
  const line = Array.from({ length: Math.max(a.length, b.length) }, (_, i) => i).find((i) => a[i] !== b[i]) ?? 0;
  return `first difference at line ${line + 1}:\n  file: ${a[line] ?? '(end of file)'}\n  run:  ${b[line] ?? '(end of file)'}`;
}
