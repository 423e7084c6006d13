import { dateOf, type Clock } from '../domain/clock.ts';
import { createHash } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Storage } from '../storage/db.ts';
import {
  claimIdempotencyKey,
  completeIdempotencyKey,
  findIdempotencyKey,
  releaseIdempotencyKey,
  type IdempotencyClaim,
} from '../storage/idempotency.ts';
import { bearerToken } from './auth.ts';
import { ApiError } from './errors.ts';
import { isMetadataHeader, METADATA_HEADER } from './metadata.ts';
import { openResponse, sealResponse, type SealContext } from './sealed-response.ts';

export const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
/**
 * How long a claim may stay in flight before a retry may take the key over. A standard endpoint
 * answers within seconds (SQLite waits at most 10 s for its lock), so a claim this old was left by
 * a process that died mid-request.
 */
export const IDEMPOTENCY_LEASE_MS = 60_000;
const HEADER = 'idempotency-key';

declare module 'fastify' {
  interface FastifyRequest {
    idempotencyClaim?: IdempotencyClaim;
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
  clock: Clock,
): Promise<'proceed' | 'replayed'> {
  const key = readKey(request);
  if (key === null) return 'proceed';
  const { claim, finished } = await claimKey(storage, { scope, key, requestHash: fingerprint(request), leaseMs: IDEMPOTENCY_LEASE_MS, now: dateOf(clock) });
  if (!finished) {
    request.idempotencyClaim = claim;
    return 'proceed';
  }
  const body = openResponse(finished.response_body, sealContext(request, claim));
  if (body === null) throw new ApiError('internal_error', 'The stored response of this Idempotency-Key cannot be read.');
  // SQLite runs with safe integers, so the stored status may arrive as a bigint.
  await reply
    .status(Number(finished.response_status))
    .header('idempotent-replayed', 'true')
    .type('application/json; charset=utf-8')
    .send(body);
  return 'replayed';
}

/** A finished key's stored response, its body sealed. */
export type FinishedKey = { response_status: number; response_body: string };

/**
 * Claims `key` in `scope` for the request fingerprinted `requestHash`, held `leaseMs` from `now`:
 * `finished` is null when the key was free and is now claimed, else the response the same request
 * finished with (`claim` then names the key, for unsealing). A key still in flight or just released is refused with 409, a key
 * reused for another request with 422. The standard endpoints and forwarded calls share it.
 */
export async function claimKey(
  storage: Storage,
  { scope, key, requestHash, leaseMs, now }: { scope: string; key: string; requestHash: string; leaseMs: number; now: Date },
): Promise<{ claim: IdempotencyClaim; finished: FinishedKey | null }> {
  const claim: IdempotencyClaim = { scope, key, created_at: now.toISOString() };
  const claimed = await claimIdempotencyKey(storage.db, {
    ...claim,
    request_hash: requestHash,
    expires_at: new Date(now.getTime() + leaseMs).toISOString(),
  });
  if (claimed) return { claim, finished: null };
  const existing = await findIdempotencyKey(storage.db, scope, key);
  if (!existing) throw inUse(1, 'This Idempotency-Key was just released; retry.');
  if (existing.request_hash !== requestHash) throw new ApiError('idempotency_key_reused');
  const { response_status, response_body } = existing;
  // A finished key has both (completeIdempotencyKey writes them together).
  if (existing.state !== 'done' || response_status === null || response_body === null) {
    throw inUse(Math.ceil((Date.parse(existing.expires_at) - now.getTime()) / 1000));
  }
  return { claim, finished: { response_status, response_body } };
}

/** 409 with the seconds until the running claim's lease ends, when a retry may take the key over. */
export function inUse(retryAfterSeconds: number, message?: string): ApiError {
  return new ApiError('idempotency_key_in_use', message, {
    // Claims of another instance may be a clock skew younger than ours: never beyond one lease.
    headers: { 'retry-after': String(Math.min(IDEMPOTENCY_LEASE_MS / 1000, Math.max(1, retryAfterSeconds))) },
  });
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
    await releaseIdempotencyKey(storage.db, claim);
    return;
  }
  const expiresAt = new Date(Date.parse(claim.created_at) + IDEMPOTENCY_TTL_MS).toISOString();
  const body = sealResponse(payload, sealContext(request, claim));
  const stored = await completeIdempotencyKey(storage.db, claim, { status: statusCode, body, expiresAt });
  if (!stored) request.log.warn({ idempotencyKey: claim.key }, 'idempotency claim outlived its lease and was taken over; response not stored');
}

/** Sealed under the caller's raw credential: only a retry by the same caller opens the response. */
function sealContext(request: FastifyRequest, claim: IdempotencyClaim): SealContext {
  return { credential: bearerToken(request) ?? '', scope: claim.scope, key: claim.key };
}

/** The request's Idempotency-Key, null when it has none; 400 when it is empty or over 255 characters. */
export function readKey(request: FastifyRequest): string | null {
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


/**
 * What makes two requests "the same": method, path with its query string (POST /requests takes
 * metadata there too), content headers and the body.
 */
function fingerprint(request: FastifyRequest): string {
  const hash = createHash('sha256').update(`${request.method} ${request.url}\n`);
  // Headers that carry part of a request's content (metadata on POST /requests), not transport.
  // x-service-metadata is always hashed, present or not, as before the other metadata headers
  // were read: a key stored then still matches its retry.
  hash.update(`${METADATA_HEADER}: ${String(request.headers[METADATA_HEADER] ?? '')}\n`);
  const others = Object.keys(request.headers).filter((name) => name !== METADATA_HEADER && isMetadataHeader(name));
  for (const name of others.sort()) hash.update(`${name}: ${String(request.headers[name])}\n`);
  return hash.update(normalizedBody(request.rawBody)).digest('hex');
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
