import type { FastifyInstance, FastifyRequest } from 'fastify';
import { validationError, type Issue } from './errors.ts';

const NUL = '\u0000';

/**
 * Refuses a NUL character anywhere in the path parameters, query or JSON body with 400. PostgreSQL
 * text cannot hold one (the insert or lookup would fail as a 500), and SQLite would store what
 * PostgreSQL refuses: one answer on both engines.
 */
export function rejectNulCharacters(app: FastifyInstance): void {
  app.addHook('preValidation', async (request) => {
    const issue = firstNul(request);
    if (issue) throw validationError([issue], `Invalid request: ${issue.path.join('.')}: ${issue.message}`);
  });
}

function firstNul(request: FastifyRequest): Issue | null {
  const where = findNul(request.params, []) ?? findNul(request.query, []) ?? findNul(request.body, []);
  return where ? { path: where, message: 'must not contain the NUL character (\\u0000)' } : null;
}

/**
 * The path of the first string (or object key) holding a NUL, walking plain JSON values only.
 * Iterative, and paths are built only for the value found: a deeply nested value costs neither
 * stack nor a copy of its path per level.
 */
export function findNul(root: unknown, rootPath: string[]): string[] | null {
  type Visit = { value: unknown; key: string | null; parent: Visit | null };
  const stack: Visit[] = [{ value: root, key: null, parent: null }];
  while (stack.length > 0) {
    const visit = stack.pop()!;
    const { value } = visit;
    if (typeof value === 'string') {
      if (value.includes(NUL)) return [...rootPath, ...pathTo(visit)];
      continue;
    }
    if (value === null || typeof value !== 'object' || Buffer.isBuffer(value)) continue;
    // Pushed in reverse so the first member is visited first (the issue names the first NUL).
    const entries = Array.isArray(value) ? value.map((item, i) => [String(i), item] as const) : Object.entries(value);
    for (let i = entries.length - 1; i >= 0; i--) {
      const [key, item] = entries[i]!;
      if (key.includes(NUL)) return [...rootPath, ...pathTo(visit), key];
      stack.push({ value: item, key, parent: visit });
    }
  }
  return null;
}

function pathTo(visit: { key: string | null; parent: unknown }): string[] {
  const path: string[] = [];
  for (let v: typeof visit | null = visit; v; v = v.parent as typeof visit | null) {
    if (v.key !== null) path.push(v.key);
  }
  return path.reverse();
}
