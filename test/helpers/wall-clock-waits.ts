import ts from 'typescript';

/**
 * Finds where test code waits on the wall clock instead of on an event or the app's TestClock:
 * sleeps longer than {@link LONGEST_SLEEP_MS} (or of a length the file does not fix), loops that
 * poll by sleeping, and helpers that wait "until" something beside the suite's one `until`
 * (test/helpers/until.ts). Read through the TypeScript parser, so strings and comments never
 * count.
 *
 * A wait that really is about wall time (a provider that takes this long to answer, a relay
 * timeout measured in real milliseconds, a sampler running beside a load) says so with a
 * `Wall clock:` comment on its line or the line above, and is not reported.
 */

export const LONGEST_SLEEP_MS = 50;

/** Names of functions that only wait (a local `const sleep = …`, node's timers/promises setTimeout). */
const SLEEP_NAMES = new Set(['sleep', 'pause', 'delay', 'wait']);
/** Names a home-made wait-until helper goes by. */
const UNTIL_NAMES = /^(?:until|waitUntil|eventually|poll(?:Until)?|waitFor[A-Z]\w*|retryUntil)$/;
const MARKER = /wall clock:/i;

export type WallClockWait = { line: number; kind: 'sleep' | 'poll loop' | 'until helper'; text: string };

export function wallClockWaitsIn(fileName: string, source: string): WallClockWait[] {
  const file = ts.createSourceFile(fileName, source, ts.ScriptTarget.Latest, true);
  const lines = source.split('\n');
  const constants = numericConstants(file);
  const sleepNames = new Set([...SLEEP_NAMES, ...timersPromisesAliases(file)]);
  const found: WallClockWait[] = [];

  const lineOf = (node: ts.Node) => file.getLineAndCharacterOfPosition(node.getStart(file)).line;
  const marked = (node: ts.Node) => {
    const line = lineOf(node);
    return MARKER.test(lines[line] ?? '') || MARKER.test(lines[line - 1] ?? '');
  };
  const report = (node: ts.Node, kind: WallClockWait['kind']) => {
    if (marked(node)) return;
    found.push({ line: lineOf(node) + 1, kind, text: (lines[lineOf(node)] ?? '').trim() });
  };

  /** The milliseconds a call sleeps, `undefined` when it is no sleep, `NaN` when the file does not fix it. */
  const sleptMs = (call: ts.CallExpression): number | undefined => {
    const callee = call.expression;
    if (!ts.isIdentifier(callee)) return undefined;
    const [first, second] = call.arguments;
    // setTimeout(resolve, ms): a promise that only resolves later. A sleep helper's own body
    // (`(ms) => new Promise((r) => setTimeout(r, ms))`) is judged where it is called instead.
    if (callee.text === 'setTimeout' && first && ts.isIdentifier(first) && second) return isParameter(second) ? undefined : valueOf(second, constants);
    if (sleepNames.has(callee.text) && first) return valueOf(first, constants);
    return undefined;
  };
  const sleepsWithin = (node: ts.Node): boolean => {
    let sleeps = false;
    const visit = (n: ts.Node) => {
      if (ts.isCallExpression(n) && sleptMs(n) !== undefined && !marked(n)) sleeps = true;
      if (!sleeps) ts.forEachChild(n, visit);
    };
    visit(node);
    return sleeps;
  };

  const visit = (node: ts.Node) => {
    if (ts.isCallExpression(node)) {
      const ms = sleptMs(node);
      if (ms !== undefined && !(ms <= LONGEST_SLEEP_MS)) report(node, 'sleep');
    }
    if ((ts.isWhileStatement(node) || ts.isDoStatement(node) || ts.isForStatement(node)) && sleepsWithin(node)) report(node, 'poll loop');
    const name = declaredFunctionName(node);
    if (name && UNTIL_NAMES.test(name)) report(node, 'until helper');
    ts.forEachChild(node, visit);
  };
  visit(file);
  return found;
}

/** A bare parameter of a function around it. */
function isParameter(node: ts.Expression): boolean {
  if (!ts.isIdentifier(node)) return false;
  for (let scope: ts.Node | undefined = node.parent; scope; scope = scope.parent) {
    if (ts.isFunctionLike(scope) && scope.parameters.some((p) => ts.isIdentifier(p.name) && p.name.text === node.text)) return true;
  }
  return false;
}

/** `function until() {}`, `const until = () => …`, `const until = async function () {}`. */
function declaredFunctionName(node: ts.Node): string | undefined {
  if (ts.isFunctionDeclaration(node)) return node.name?.text;
  if (ts.isVariableDeclaration(node) && ts.isIdentifier(node.name) && node.initializer) {
    if (ts.isArrowFunction(node.initializer) || ts.isFunctionExpression(node.initializer)) return node.name.text;
  }
  return undefined;
}

/** `const NAME = 1_500` anywhere in the file (a constant's name is unique enough in a test file). */
function numericConstants(file: ts.SourceFile): Map<string, number> {
  const constants = new Map<string, number>();
  const visit = (node: ts.Node) => {
    if (ts.isVariableDeclaration(node) && ts.isIdentifier(node.name) && node.initializer && ts.isNumericLiteral(node.initializer)) {
      const list = node.parent;
      if (ts.isVariableDeclarationList(list) && list.flags & ts.NodeFlags.Const) constants.set(node.name.text, Number(node.initializer.text));
    }
    ts.forEachChild(node, visit);
  };
  visit(file);
  return constants;
}

/** Local names of node's promise-returning setTimeout (`import { setTimeout as sleep } from 'node:timers/promises'`). */
function timersPromisesAliases(file: ts.SourceFile): string[] {
  const names: string[] = [];
  for (const statement of file.statements) {
    if (!ts.isImportDeclaration(statement) || !ts.isStringLiteral(statement.moduleSpecifier)) continue;
    if (!/^(?:node:)?timers\/promises$/.test(statement.moduleSpecifier.text)) continue;
    const bindings = statement.importClause?.namedBindings;
    if (bindings && ts.isNamedImports(bindings)) {
      for (const element of bindings.elements) if ((element.propertyName ?? element.name).text === 'setTimeout') names.push(element.name.text);
    }
  }
  return names;
}

/** A number the file fixes: a literal, a numeric constant, or arithmetic on them; NaN otherwise. */
function valueOf(node: ts.Expression, constants: Map<string, number>): number {
  if (ts.isNumericLiteral(node)) return Number(node.text);
  if (ts.isIdentifier(node)) return constants.get(node.text) ?? NaN;
  if (ts.isParenthesizedExpression(node)) return valueOf(node.expression, constants);
  if (ts.isBinaryExpression(node)) {
    const left = valueOf(node.left, constants);
    const right = valueOf(node.right, constants);
    switch (node.operatorToken.kind) {
      case ts.SyntaxKind.AsteriskToken:
        return left * right;
      case ts.SyntaxKind.PlusToken:
        return left + right;
      case ts.SyntaxKind.MinusToken:
        return left - right;
      case ts.SyntaxKind.SlashToken:
        return left / right;
    }
  }
  return NaN;
}
