import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

/**
 * Finds what code comments point at: repository files (`src/ledger/holds.ts`, `money.ts`,
 * `docs/errors.md`), decision records (`decision 0019`, `decisions 0011 and 0013`) and places
 * outside the repository (a design file, a shared folder beside it, issue numbers), and tells
 * which of them do not resolve. Comments are read through the TypeScript parser, so a `//` inside
 * a string or a URL is never taken for a comment.
 */

export const REPO_ROOT = resolve(import.meta.dirname, '../..');

export interface DanglingReference {
  file: string;
  line: number;
  reference: string;
  reason: string;
}

export interface CommentText {
  text: string;
  /** Offset of the comment in its file. */
  pos: number;
}

/** Every comment of a TypeScript or JavaScript source, each once. */
export function commentsOf(fileName: string, source: string): CommentText[] {
  const file = ts.createSourceFile(fileName, source, ts.ScriptTarget.Latest, false);
  const seen = new Map<number, CommentText>();
  const collect = (ranges: readonly ts.CommentRange[] | undefined) => {
    for (const range of ranges ?? []) {
      if (!seen.has(range.pos)) seen.set(range.pos, { text: source.slice(range.pos, range.end), pos: range.pos });
    }
  };
  const visit = (node: ts.Node) => {
    collect(ts.getLeadingCommentRanges(source, node.pos));
    collect(ts.getTrailingCommentRanges(source, node.end));
    ts.forEachChild(node, visit);
  };
  collect(ts.getLeadingCommentRanges(source, 0));
  visit(file);
  return [...seen.values()].sort((a, b) => a.pos - b.pos);
}

/** Folders whose names start a repository-rooted path; a path starting elsewhere needs an extension. */
const ROOTED = ['src', 'test', 'bench', 'docs', 'bin'];
const EXTENSIONS = ['ts', 'mts', 'mjs', 'js', 'md', 'json', 'sql'];

/**
 * Path-shaped words: `src/…` or `docs/…` (any tail), or a word with at least one slash that ends
 * in a source or document extension. A URL (`https://host/a.ts`), a package (`@scope/x.js`), a
 * path with a placeholder (`<id>`, `*`, `{…}`) or under node_modules/dist is no repository file.
 */
const PATH_WORD = new RegExp(
  String.raw`(?<![\w@:/.<{*$~-])((?:\.{1,2}/)*(?:(?:${ROOTED.join('|')})/[\w./-]*[\w/]|[\w.-]+(?:/[\w.-]+)+\.(?:${EXTENSIONS.join('|')})))(?![\w<{*-]|\.\w|/[<{*])`,
  'g',
);
const OUTSIDE_TREES = /^(?:\.\.\/)*(?:node_modules|dist|coverage|data|test-artifacts|bench\/results)\//;

export function pathReferences(comment: string): string[] {
  const found: string[] = [];
  for (const match of comment.matchAll(PATH_WORD)) {
    const word = match[1]!.replace(/[.]+$/, '');
    if (OUTSIDE_TREES.test(word) || /\/(?:node_modules|dist)\//.test(word)) continue;
    found.push(word);
  }
  return found;
}

/**
 * File names without a folder (`money.ts`, `README.md`). `.js` is left out: `Node.js` is a name,
 * not a file.
 */
const FILE_NAME = /(?<![\w@:/.<{*$~-])([\w-]+\.(?:ts|mts|mjs|md))(?![\w/-])/g;

export function fileNameReferences(comment: string): string[] {
  return [...comment.matchAll(FILE_NAME)].map((match) => match[1]!);
}

/** A block comment with a comment opener on one of its lines lost its end and swallowed what followed. */
export function swallowsAnotherComment(comment: string): boolean {
  return comment.startsWith('/*') && /\n\s*\/\*/.test(comment);
}

/** Decision numbers named in a comment: `decision 0019`, `decisions 0011 and 0013`, `decisions 0011/0013`. */
export function decisionReferences(comment: string): string[] {
  const found: string[] = [];
  for (const match of comment.matchAll(/\bdecisions?\s+(\d{4}(?:(?:\s*,\s*|\s+and\s+|\s*\/\s*|\s+or\s+)\d{4})*)/gi)) {
    found.push(...match[1]!.match(/\d{4}/g)!);
  }
  return found;
}

/** References to what is not in the repository at all: a design file, a sibling shared folder, issue numbers. */
export function outsideReferences(comment: string): string[] {
  const patterns = [/\bDESIGN\.md\b/g, /\bDESIGN\s*§\s*\d+/g, /\.\.\/shared\b/g, /\b[Ii]ssues?\s+#?\d+\b/g, /(?<![\w&#])#\d{1,4}\b(?![\w-])/g];
  return patterns.flatMap((pattern) => [...comment.matchAll(pattern)].map((m) => m[0]));
}

function decisionNumbers(): Set<string> {
  const folder = join(REPO_ROOT, 'docs/decisions');
  return new Set(readdirSync(folder).flatMap((name) => /^(\d{4})-.*\.md$/.exec(name)?.[1] ?? []));
}

/** A path resolves when it names a file or folder relative to the repository root, to src/, or to the file's own folder. */
function resolves(reference: string, fromFile: string): boolean {
  const bases = [REPO_ROOT, join(REPO_ROOT, 'src'), dirname(fromFile)];
  const candidates = [reference, reference.replace(/\.js$/, '.ts')];
  return bases.some((base) => candidates.some((candidate) => existsSync(resolve(base, candidate))));
}

function lineAt(source: string, pos: number): number {
  let line = 1;
  for (let i = 0; i < pos; i++) if (source.charCodeAt(i) === 10) line++;
  return line;
}

let fileNamesInRepository: Set<string> | undefined;

/** A file name alone resolves when some tracked folder holds a file of that name. */
function someFileIsNamed(name: string): boolean {
  fileNamesInRepository ??= new Set(
    ['src', 'test', 'bench', 'docs', 'bin'].flatMap((folder) =>
      readdirSync(join(REPO_ROOT, folder), { recursive: true, encoding: 'utf8' }).map((path) => path.split(/[\\/]/).pop()!),
    ),
  );
  return fileNamesInRepository.has(name) || existsSync(join(REPO_ROOT, name));
}

/** Dangling references in the comments of one source text. */
export function danglingReferencesIn(file: string, source: string, decisions = decisionNumbers()): DanglingReference[] {
  const dangling: DanglingReference[] = [];
  const where = relative(REPO_ROOT, file);
  for (const comment of commentsOf(file, source)) {
    const line = lineAt(source, comment.pos);
    const outside = outsideReferences(comment.text);
    for (const reference of outside) {
      dangling.push({ file: where, line, reference, reason: 'points outside the repository' });
    }
    for (const reference of pathReferences(comment.text)) {
      if (!resolves(reference, file)) dangling.push({ file: where, line, reference, reason: 'no such file' });
    }
    for (const reference of fileNameReferences(comment.text)) {
      if (!outside.includes(reference) && !someFileIsNamed(reference)) dangling.push({ file: where, line, reference, reason: 'no file of that name' });
    }
    if (swallowsAnotherComment(comment.text)) {
      dangling.push({ file: where, line, reference: comment.text.split('\n')[1]!.trim(), reason: 'comment never closed before the next one' });
    }
    for (const number of decisionReferences(comment.text)) {
      if (!decisions.has(number)) dangling.push({ file: where, line, reference: `decision ${number}`, reason: 'no such decision record' });
    }
  }
  return dangling;
}

/** Every .ts/.mts/.mjs/.js source under the given repository folders. */
export function sourceFiles(folders: string[]): string[] {
  return folders.flatMap((folder) =>
    readdirSync(join(REPO_ROOT, folder), { recursive: true, encoding: 'utf8' })
      .filter((name) => /\.(?:ts|mts|mjs|js)$/.test(name) && !name.split(/[\\/]/).includes('node_modules'))
      .map((name) => join(REPO_ROOT, folder, name)),
  );
}

export function danglingReferences(folders: string[]): DanglingReference[] {
  const decisions = decisionNumbers();
  return sourceFiles(folders).flatMap((file) => danglingReferencesIn(file, readFileSync(file, 'utf8'), decisions));
}

/**
 * Dangling file names in a Markdown page's code spans (`src/ledger/holds.ts`, `calls.ts`): paths
 * resolve from the repository root, src/, docs/ or the page's own folder; a name alone resolves
 * when some tracked folder holds a file of that name.
 */
export function danglingReferencesInMarkdown(file: string, text = readFileSync(file, 'utf8')): DanglingReference[] {
  const where = relative(REPO_ROOT, file);
  const dangling: DanglingReference[] = [];
  text
    .split('\n')
    .forEach((text, i) => {
      for (const [, span] of text.matchAll(/`([^`]+)`/g)) {
        for (const reference of pathReferences(span!)) {
          const found = resolves(reference, file) || existsSync(resolve(REPO_ROOT, 'docs', reference));
          if (!found) dangling.push({ file: where, line: i + 1, reference, reason: 'no such file' });
        }
        for (const reference of fileNameReferences(span!)) {
          if (!someFileIsNamed(reference)) dangling.push({ file: where, line: i + 1, reference, reason: 'no file of that name' });
        }
      }
    });
  return dangling;
}
