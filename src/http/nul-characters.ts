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

/** The path of the first string (or object key) holding a NUL, walking plain JSON values only. */
function findNul(value: unknown, path: string[]): string[] | null {
  if (typeof value === 'string') return value.includes(NUL) ? path : null;
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) {
      const found = findNul(item, [...path, String(i)]);
      if (found) return found;
    }
    return null;
  }
  if (value === null || typeof value !== 'object' || Buffer.isBuffer(value)) return null;
  for (const [key, item] of Object.entries(value)) {
    if (key.includes(NUL)) return [...path, key];
    const found = findNul(item, [...path, key]);
    if (found) return found;
  }
  return null;
}
