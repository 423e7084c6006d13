import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { danglingReferences, danglingReferencesIn, danglingReferencesInMarkdown, outsideReferences, REPO_ROOT } from '../helpers/comment-references.ts';

/**
 * Comments send a reader to files, decision records and rules. A comment naming a file that was
 * renamed or deleted, a decision that does not exist, or a document outside the repository sends
 * them nowhere; these tests name every such comment.
 */

const describeDangling = (found: ReturnType<typeof danglingReferences>) =>
  found.map((d) => `${d.file}:${d.line} ${d.reference} (${d.reason})`);

describe('references in code comments', () => {
  it('every file, folder and decision named in a comment of src/, test/ or bench/ exists', () => {
    expect(describeDangling(danglingReferences(['src', 'test', 'bench']))).toEqual([]);
  });

  it('every file named in the architecture page and the READMEs of src/ folders exists', () => {
    const pages = [
      join(REPO_ROOT, 'docs/architecture.md'),
      ...readdirSync(join(REPO_ROOT, 'src'), { recursive: true, encoding: 'utf8' })
        .filter((name) => name.endsWith('README.md'))
        .map((name) => join(REPO_ROOT, 'src', name)),
    ];
    expect(pages.length).toBeGreaterThan(1);
    expect(describeDangling(pages.flatMap((page) => danglingReferencesInMarkdown(page)))).toEqual([]);
  });

  it('documents and the README cite neither issue numbers nor a design file outside the repository', () => {
    const documents = ['README.md', ...readdirSync(join(REPO_ROOT, 'docs'), { recursive: true, encoding: 'utf8' })
      .filter((name) => name.endsWith('.md'))
      .map((name) => join('docs', name))];
    const found = documents.flatMap((path) =>
      readFileSync(join(REPO_ROOT, path), 'utf8')
        .split('\n')
        .flatMap((text, i) => outsideReferences(text).map((reference) => `${path}:${i + 1} ${reference}`)),
    );
    expect(found).toEqual([]);
  });
});

describe('the reference check itself', () => {
  const file = join(REPO_ROOT, 'src/ledger/example.ts');
  const check = (source: string) => danglingReferencesIn(file, source, new Set(['0019'])).map((d) => d.reference);

  it('flags files, names and decisions that do not exist, and places outside the repository', () => {
    const source = [
      '/** Written by gateway/writer.ts, see src/ledger/gone.ts and docs/missing.md. */',
      '// Rounding as in nowhere.ts; decisions 0019 and 0042 apply.',
      '/* DESIGN §7 and DESIGN.md; ../shared/spec; issue 22; #18. */',
      'export const x = 1;',
    ].join('\n');
    expect(check(source)).toEqual([
      'gateway/writer.ts', 'src/ledger/gone.ts', 'docs/missing.md',
      'nowhere.ts', 'decision 0042',
      'DESIGN.md', 'DESIGN §7', '../shared', 'issue 22', '#18',
    ]);
  });

  it('resolves paths from the repository root, from src/ and from the file own folder', () => {
    const source = [
      '// src/ledger/holds.ts, ledger/holds.ts, ./holds.ts, ../domain/money.ts, docs/errors.md, src/domain/',
      '// money.ts is named alone; decision 0019 exists.',
      'export const x = 1;',
    ].join('\n');
    expect(check(source)).toEqual([]);
  });

  it('does not take URLs, packages, strings, placeholders, colours or build output for references', () => {
    const source = [
      '// https://example.com/docs/guide.md and http://127.0.0.1/v1/x.ts are addresses.',
      '// @scope/package.js is a package; Node.js is a runtime; $HOME/tollgate/credentials.json an env path.',
      '// dist/src/main.js is build output; node_modules/x/y.ts is a dependency; bench/results/latest.md is generated.',
      '// docs/decisions/NNNN-*.md and src/<folder>/README.md are patterns; colour #0b5394; &#39; escapes.',
      "export const url = 'docs/not-a-comment.md'; // a string is not a comment",
      'export const slashes = "// src/also-a-string.ts";',
    ].join('\n');
    expect(check(source)).toEqual([]);
  });

  it('checks the code spans of a Markdown page, not its prose', () => {
    const page = join(REPO_ROOT, 'src/ledger/README.md');
    const text = 'See `src/ledger/nope.ts`, `gone.ts`, `holds.ts`, `journal/calls.ts` and `docs/errors.md`; prose/words.ts is not checked.';
    expect(danglingReferencesInMarkdown(page, text).map((d) => d.reference)).toEqual(['src/ledger/nope.ts', 'gone.ts']);
  });

  it('flags a block comment that lost its end and swallowed the next one', () => {
    const source = ['/**', ' * A comment whose end was deleted.', '', '/** The next one. */', 'export const x = 1;'].join('\n');
    expect(check(source)).toEqual(['* A comment whose end was deleted.']);
  });
});
