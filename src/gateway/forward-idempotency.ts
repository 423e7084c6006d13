/**
 * `Idempotency-Key` on forwarded calls (/v1/forward and the drop-in provider endpoints): a retry
 * with the same key is never sent to the provider, so it is never charged twice. While the first
 * call is relaying, a retry gets 409 `idempotency_key_in_use`; once it is answered, the retry gets
 * the same answer back (JSON, binary or a whole event stream, up to REPLAY_LIMIT_BYTES), marked
 * `Idempotent-Replayed: true`. An answer that was charged but not kept (over the limit, cut by the
 * provider, or left by its client) answers a retry with 409 `idempotent_answer_not_kept`. A call
 * that failed before or at the provider (refused by Tollgate, unreachable, a provider 5xx) frees
 * its key: nothing was charged, so a retry may go through. See decision 0027.
 */
import { createHash } from 'node:crypto';
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { dateOf, type Clock } from '../domain/clock.ts';
import { ApiError } from '../http/errors.ts';
import { isMetadataHeader } from '../http/metadata.ts';
import { claimKey, IDEMPOTENCY_TTL_MS, readKey } from '../http/idempotency.ts';
import { openResponse, sealResponse, type SealContext } from '../http/sealed-response.ts';
import type { Storage } from '../storage/db.ts';
import { completeIdempotencyKey, releaseIdempotencyKey, type IdempotencyClaim } from '../storage/idempotency.ts';
import type { RelayOutcome } from './relay.ts';

/** The largest answer kept for replays (an image generation's base64 fits; a long audio file may not). */
export const REPLAY_LIMIT_BYTES = 8 * 1024 * 1024;

/** Response headers a replay repeats; every other header described one delivery. */
const REPLAYED_HEADERS = ['content-type', 'x-tollgate-request-id', 'x-lava-request-id'] as const;

/** A claimed key: where its answer is stored, and what it seals the answer with. */
export type ForwardKey = { claim: IdempotencyClaim; seal: SealContext };

/** What a kept answer is, stored sealed as JSON. */
type StoredAnswer = { status: number; headers: Record<string, string>; body: string | null };

/**
 * Claims the call's key before anything is decided or sent; null when it has none. Replays a
 * kept answer (returns 'replayed'), or throws the 409/422 a retry gets.
 */
export async function claimForwardKey(
  storage: Storage,
  clock: Clock,
  request: FastifyRequest,
  reply: FastifyReply,
  call: { credential: string; leaseMs: number },
): Promise<ForwardKey | 'replayed' | null> {
  const key = readKey(request);
  if (key === null) return null;
  // Keys are the caller's own: scoped by its credential, as the standard endpoints scope them by key.
  const scope = `forward:${createHash('sha256').update(call.credential).digest('hex')}`;
  const seal: SealContext = { credential: call.credential, scope, key };
  // A forwarded call may relay for as long as its hold lives: the claim is kept that long, so a
  // retry during a long stream cannot take the key over and call the provider a second time.
  const { claim, finished } = await claimKey(storage, { scope, key, requestHash: fingerprint(request), leaseMs: call.leaseMs, now: dateOf(clock) });
  if (!finished) return { claim, seal };
  const opened = openResponse(finished.response_body, seal);
  if (opened === null) throw new ApiError('internal_error', 'The stored answer of this Idempotency-Key cannot be read.');
  const answer = JSON.parse(opened) as StoredAnswer;
  if (answer.body === null) throw new ApiError('idempotent_answer_not_kept');
  reply.hijack();
  reply.raw.writeHead(answer.status, { ...answer.headers, 'idempotent-replayed': 'true' });
  reply.raw.end(Buffer.from(answer.body, 'base64'));
  return 'replayed';
}

/** Frees the key of a call refused before the provider was called: a retry may go through. */
export async function releaseForwardKey(storage: Storage, key: ForwardKey): Promise<void> {
  await releaseIdempotencyKey(storage.db, key.claim);
}

/** What the client was sent, as far as a replay needs it (see tapResponse). */
export type ResponseTap = { status(): number; headers(): Record<string, string>; body(): Buffer | null };

/**
 * Keeps a copy of what is written to the client, up to REPLAY_LIMIT_BYTES, by wrapping this one
 * response's writeHead, write and end. The relay writes in several ways (whole bodies, event
 * streams, translated answers, Tollgate's own errors); the copy sees them all without the relay
 * knowing about replays.
 */
export function tapResponse(res: ServerResponse): ResponseTap {
  let status = 0;
  const headers: Record<string, string> = {};
  const chunks: Buffer[] = [];
  let size = 0;
  let overflow = false;
  const keep = (chunk: unknown, encoding: unknown) => {
    if (overflow || chunk === undefined || chunk === null || typeof chunk === 'function') return;
    const bytes = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
    size += bytes.length;
    if (size > REPLAY_LIMIT_BYTES) {
      overflow = true;
      chunks.length = 0;
    } else chunks.push(Buffer.from(bytes));
  };
  const writeHead = res.writeHead.bind(res) as (...args: unknown[]) => ServerResponse;
  const write = res.write.bind(res) as (...args: unknown[]) => boolean;
  const end = res.end.bind(res) as (...args: unknown[]) => ServerResponse;
  res.writeHead = ((code: number, ...rest: unknown[]) => {
    status = code;
    const given = rest.find((arg): arg is OutgoingHttpHeaders => typeof arg === 'object' && arg !== null && !Array.isArray(arg));
    for (const name of REPLAYED_HEADERS) {
      const value = given?.[name] ?? res.getHeader(name);
      if (value !== undefined) headers[name] = String(value);
    }
    return writeHead(code, ...rest);
  }) as ServerResponse['writeHead'];
  res.write = ((chunk: unknown, ...rest: unknown[]) => {
    keep(chunk, rest[0]);
    return write(chunk, ...rest);
  }) as ServerResponse['write'];
  res.end = ((chunk?: unknown, ...rest: unknown[]) => {
    keep(chunk, rest[0]);
    return end(chunk, ...rest);
  }) as ServerResponse['end'];
  return {
    status: () => status,
    headers: () => headers,
    // Only a response ended as a whole (a cut one is destroyed without end) can be replayed.
    body: () => (overflow || !res.writableEnded ? null : Buffer.concat(chunks)),
  };
}

/**
 * Records how the call ended. Nothing charged (the provider unreachable, a provider server error)
 * frees the key; anything else is kept for 24 h: the answer itself when it was whole and small
 * enough, else the fact that it was answered.
 */
export async function finishForwardKey(storage: Storage, key: ForwardKey, outcome: RelayOutcome, tap: ResponseTap, log: FastifyRequest['log']): Promise<void> {
  const serverError = outcome.kind === 'answered' && outcome.status >= 500;
  if (outcome.kind === 'failed' || serverError || (outcome.kind === 'abandoned' && !outcome.requestSent)) {
    await releaseIdempotencyKey(storage.db, key.claim);
    return;
  }
  const body = outcome.kind === 'answered' && !outcome.clientAborted && outcome.cutBody === null ? tap.body() : null;
  const answer: StoredAnswer = { status: tap.status(), headers: tap.headers(), body: body === null ? null : body.toString('base64') };
  const expiresAt = new Date(Date.parse(key.claim.created_at) + IDEMPOTENCY_TTL_MS).toISOString();
  const stored = await completeIdempotencyKey(storage.db, key.claim, {
    status: answer.status,
    body: sealResponse(JSON.stringify(answer), key.seal),
    expiresAt,
  });
  if (!stored) log.warn({ idempotencyKey: key.claim.key }, 'forward idempotency claim outlived its lease; answer not stored');
}

/** Same method, same URL (the target and Tollgate's parameters), same metadata headers and the same body bytes: the same call. */
function fingerprint(request: FastifyRequest): string {
  const hash = createHash('sha256').update(`${request.method} ${request.url}\n`);
  for (const name of Object.keys(request.headers).filter(isMetadataHeader).sort()) hash.update(`${name}: ${String(request.headers[name])}\n`);
  if (Buffer.isBuffer(request.body)) hash.update(request.body);
  return hash.digest('hex');
}
