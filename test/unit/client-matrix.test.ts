import { describe, expect, it } from 'vitest';
import { renderClientMatrix, type CoveredTest } from '../helpers/client-matrix.ts';

/** The docs/clients.md table: one row per client and call, one cell per path, from a run's tests. */
describe('renderClientMatrix', () => {
  const major = (pkg: string) => (pkg === 'ai' ? '7' : '9');
  const rows = (tests: CoveredTest[]) =>
    renderClientMatrix(tests, major)
      .split('\n')
      .filter((line) => line.startsWith('| `'));

  it('marks a cell tested when a test covering it passed, and lists rows in the fixed client and call order', () => {
    const table = rows([
      { coverage: [{ client: '@anthropic-ai/sdk', call: 'text', path: 'forward' }], outcome: 'passed' },
      { coverage: [{ client: 'openai', call: 'tool call', path: 'drop-in' }, { client: 'openai', call: 'text', path: 'rewrite' }], outcome: 'passed' },
    ]);
    expect(table).toEqual([
      '| `openai` 9.x | text | — | — | tested |',
      '| `openai` 9.x | tool call | tested | — | — |',
      '| `@anthropic-ai/sdk` 9.x | text | — | tested | — |',
    ]);
  });

  it('names the awaited feature of a todo, escaping pipes, unless another test of the cell passed', () => {
    const todo = { client: '@ai-sdk/google', call: 'text', path: 'drop-in' } as const;
    expect(rows([{ coverage: [todo], outcome: 'todo', todo: 'a|b' }])).toEqual(['| `@ai-sdk/google` 9.x with `ai` 7.x | text | todo: a\\|b | — | — |']);
    expect(rows([{ coverage: [todo], outcome: 'todo', todo: 'x' }, { coverage: [todo], outcome: 'passed' }])[0]).toContain('| tested |');
  });

  it('shows a failing test as failing even when another test of the cell passed', () => {
    const cell = { client: 'openai', call: 'text', path: 'forward' } as const;
    expect(rows([{ coverage: [cell], outcome: 'passed' }, { coverage: [cell], outcome: 'failed' }])).toEqual(['| `openai` 9.x | text | — | **failing** | — |']);
  });

  it('renders the same text whatever order the workers reported in', () => {
    const tests: CoveredTest[] = [
      { coverage: [{ client: '@langchain/openai', call: 'text', path: 'forward' }], outcome: 'passed' },
      { coverage: [{ client: 'openai', call: 'embeddings', path: 'drop-in' }], outcome: 'passed' },
      { coverage: [{ client: 'openai', call: 'text', path: 'drop-in' }], outcome: 'todo', todo: 'b' },
      { coverage: [{ client: 'openai', call: 'text', path: 'drop-in' }], outcome: 'todo', todo: 'a' },
    ];
    expect(renderClientMatrix([...tests].reverse(), major)).toBe(renderClientMatrix(tests, major));
  });
});
