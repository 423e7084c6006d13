import { createHash } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Storage } from '../storage/db.ts';
import {
  claimIdempotencyKey,
  completeIdempotencyKey,
  findIdempotencyKey,
  releaseIdempotencyKey,
} from '../storage/idempotency.ts';
import { ApiError } from './errors.ts';

export const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
const HEADER = 'idempotency-key';

declare module 'fastify' {
  interface FastifyRequest {
    idempotencyClaim?: { scope: string; key: string };
  }
}

/**
 * Before the handler of an authenticated POST: replays a finished response for a repeated
 * Idempotency-Key, refuses a reused key with another body (422) or one still running (409),
 * or claims the key for this request. The claim lives in the database, so it holds across
 * instances and restarts.
 */
export async function beginIdempotentRequest(
  storage: Storage,
  request: FastifyRequest,
  reply: FastifyReply,
  scope: string,
): Promise<'proceed' | 'replayed'> {
  const key = readKey(request);
  if (key === null) return 'proceed';
  const requestHash = fingerprint(request);
  const now = new Date();
  const claimed = await claimIdempotencyKey(storage.db, {
    scope,
    key,
    request_hash: requestHash,
    created_at: now.toISOString(),
    expires_at: new Date(now.getTime() + IDEMPOTENCY_TTL_MS).toISOString(),
  });
  if (claimed) {
    request.idempotencyClaim = { scope, key };
    return 'proceed';
  }
  const existing = await findIdempotencyKey(storage.db, scope, key);
  if (!existing) throw new ApiError('idempotency_key_in_use', 'This Idempotency-Key was just released; retry.');
  if (existing.request_hash !== requestHash) throw new ApiError('idempotency_key_reused');
  if (existing.state !== 'done' || existing.response_status === null) throw new ApiError('idempotency_key_in_use');
  // SQLite runs with safe integers, so the stored status may arrive as a bigint.
  await reply
    .status(Number(existing.response_status))
    .header('idempotent-replayed', 'true')
    .type('application/json; charset=utf-8')
    .send(existing.response_body ?? '');
  return 'replayed';
}

/** In onSend: store what the claimed request answered; a server error frees the key for a retry. */
export async function finishIdempotentRequest(
  storage: Storage,
  request: FastifyRequest,
  statusCode: number,
  payload: unknown,
): Promise<void> {
  const claim = request.idempotencyClaim;
  if (!claim) return;
  request.idempotencyClaim = undefined;
  if (statusCode >= 500 || typeof payload !== 'string') {
    await releaseIdempotencyKey(storage.db, claim.scope, claim.key);
    return;
  }
  await completeIdempotencyKey(storage.db, claim.scope, claim.key, statusCode, payload);
}

function readKey(request: FastifyRequest): string | null {
  const raw = request.headers[HEADER];
  if (raw === undefined) return null;
  const value = Array.isArray(raw) ? raw[0] : raw;
  if (!value || value.length > 255) {
    throw new ApiError('validation_error', 'Idempotency-Key must be 1 to 255 characters.', {
      issues: [{ path: ['headers', HEADER], message: 'must be 1 to 255 characters' }],
    });
  }
  return value;
}

function fingerprint(request: FastifyRequest): string {
  const path = request.url.split('?')[0] ?? '';
  return createHash('sha256')
    .update(`${request.method} ${path}\n`)
    .update(normalizedBody(request.rawBody))
    .digest('hex');
}

/** Same JSON with other whitespace is the same body. */
function normalizedBody(raw: string | undefined): string {
  if (!raw || raw.trim() === '') return '';
  try {
    return JSON.stringify(JSON.parse(raw));
  } catch {
    return raw;
  }
}
