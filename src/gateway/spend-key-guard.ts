/**
 * Enforcement of spend keys on every use (drop-in endpoints and /v1/forward).
 *
 * Order of checks, each with its own code:
 *  1. the key: unknown or revoked → 401 `unauthorized`; expired → 401 `spend_key_expired`;
 *     paused → 403 `spend_key_paused` (authenticateSpendKey, at credential resolution);
 *  2. the request: endpoint shape → 403 `request_shape_mismatch`; provider → 403
 *     `provider_not_allowed`; model → 403 `model_not_allowed` (checkSpendKeyRequest; no state);
 *  3. the token bucket → 429 `spend_key_rate_limited` with Retry-After (SpendKeyBuckets: a Redis Lua
 *     script when REDIS_URL is set, else one conditional UPDATE; both atomic across instances);
 *  4. inside the admission transaction, with the key's row locked: every check of 1–2 again on the
 *     row as committed (lockSpendKeyForAdmission; a credential cached by another instance may be
 *     up to 2 s old), then the wallet, then request limit → 429 `request_limit_reached`, spend
 *     limit → 402 `spend_limit_reached` (reserveForRequest). The request's hold estimate is
 *     reserved against the key's remaining spend, so concurrent requests can never overshoot;
 *     settlement swaps the reservation for the actual cost.
 */
import type { Transaction } from 'kysely';
import { Redis } from 'ioredis';
import { SECRET_PREFIX } from '../domain/ids.ts';
import { formatMoney } from '../domain/money.ts';
import { hashesEqual, hashSecret } from '../domain/secrets.ts';
import { cycleStart, retryAfterFor, secondsUntilCycleEnd, UNITS_PER_TOKEN, type BucketSpec, type Cycle } from '../domain/spend-limits.ts';
import { ApiError } from '../http/errors.ts';
import type { Clock } from '../domain/clock.ts';
import type { Storage } from '../storage/db.ts';
import type { Database } from '../storage/schema.ts';
import { ENTRY_TTL_MS } from './credential-cache.ts';
import { bucketSpecOf, findSpendKeyByHash, takeTokenInDatabase, type SpendKeyRow } from '../storage/spend-keys.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';

export const isSpendKeyToken = (token: string): boolean => token.startsWith(SECRET_PREFIX.spendKey);

const unknownKey = () => new ApiError('unauthorized', 'Invalid or revoked spend key.');

/** Resolves a raw spend key to its live row, or refuses it (401 unknown/revoked/expired, 403 paused). */
export async function authenticateSpendKey(storage: Storage, token: string, now: Date): Promise<SpendKeyRow> {
  const hash = hashSecret(token);
  const row = await findSpendKeyByHash(storage, hash);
  if (!row || !hashesEqual(row.key_hash, hash)) throw unknownKey();
  checkKeyUsable(row, now);
  return row;
}

/** Expired → 401 `spend_key_expired`; paused → 403 `spend_key_paused`. */
function checkKeyUsable(row: SpendKeyRow, now: Date): void {
  if (row.expires_at !== null && row.expires_at <= now.toISOString()) {
    throw new ApiError('spend_key_expired', `This spend key expired at ${row.expires_at}.`);
  }
  if (row.status !== 'active') throw new ApiError('spend_key_paused');
}

export const parseList = (json: string | null): string[] | null => (json === null ? null : (JSON.parse(json) as string[]));

/** Whether an allow-list admits a model (as routed, or written `provider/model`). */
export function modelAllowed(key: Pick<SpendKeyRow, 'allowed_models'>, providerId: string, model: string | null): boolean {
  const allowed = parseList(key.allowed_models);
  if (allowed === null) return true;
  if (model === null) return false;
  return allowed.includes(model) || allowed.includes(`${providerId}/${model}`);
}

/** Whether an allow-list admits a provider: by its id, or by the provider whose account it shares (ProviderModule.sharesAccountWith). */
export function providerAllowed(key: Pick<SpendKeyRow, 'allowed_providers'>, providerId: string, sharesAccountWith?: string): boolean {
  const allowed = parseList(key.allowed_providers);
  return allowed === null || allowed.includes(providerId) || (sharesAccountWith !== undefined && allowed.includes(sharesAccountWith));
}

/** What a spend key is checked against: the provider the request goes to and the model it names. */
export type SpendKeyRequest = { providerId: string; family: string; model: string | null; sharesAccountWith?: string | undefined };

/**
 * The endpoint's shape (its provider family) against the key's → 403 `request_shape_mismatch`.
 * The drop-in endpoints call it before routing the model, so a key on the wrong endpoint hears
 * about its shape rather than about the model.
 */
export function checkRequestShape(key: Pick<SpendKeyRow, 'request_shape'>, family: string): void {
  // Gemini's native API is a third shape the two key shapes do not name: openai-shaped keys, which
  // reach Gemini models through its OpenAI-compatible path, reach them natively too.
  const shapeOk = key.request_shape === 'anthropic' ? family === 'anthropic' : family === 'openai-compatible' || family === 'google';
  if (shapeOk) return;
  throw new ApiError(
    'request_shape_mismatch',
    key.request_shape === 'anthropic'
      ? 'This spend key is anthropic-shaped: use POST /v1/messages.'
      : "This spend key is openai-shaped: use the OpenAI-shaped endpoints (chat completions, responses, embeddings) or Gemini's.",
  );
}

/** Checks that need no state: the endpoint shape, the provider and the model. */
export function checkSpendKeyRequest(key: SpendKeyRow, request: SpendKeyRequest): void {
  checkRequestShape(key, request.family);
  if (!providerAllowed(key, request.providerId, request.sharesAccountWith)) {
    throw new ApiError('provider_not_allowed', `This spend key may not use provider ${request.providerId}.`);
  }
  if (!modelAllowed(key, request.providerId, request.model)) {
    throw new ApiError('model_not_allowed', `This spend key may not use model ${request.model ?? '(none)'}.`);
  }
}

// ---------------------------------------------------------------------------------------------
// Token bucket

/**
 * Refill, check and take in one script run: Redis runs scripts one at a time, so every instance
 * sharing the Redis draws from one bucket. The clock is Redis's own, so instances' clocks cannot
 * disagree. Returns {allowed, level}.
 */
const TAKE_TOKEN_LUA = `
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'u', 'ts')
local u = tonumber(v[1])
local ts = tonumber(v[2])
if u == nil or ts == nil then u = cap; ts = now end
if now > ts then
  u = math.min(cap, u + (now - ts) * rate)
  ts = now
end
local allowed = 0
if u >= cost then
  u = u - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'u', tostring(u), 'ts', tostring(ts))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate) + 60000)
return {allowed, tostring(u)}
`;

type TakeTokenCommand = { tollgateTakeToken(key: string, cap: number, rate: number, cost: number): Promise<[number, string]> };

/**
 * Spend keys' token buckets, owned by the app: in Redis when REDIS_URL is set (one client, opened
 * here and closed with the app), else (and while Redis is away) in the database.
 */
export class SpendKeyBuckets {
  readonly #storage: Storage;
  readonly #clock: Clock;
  readonly #redisUrl: string | undefined;
  /** Connected on the first rate-limited key, so an app whose keys have no rate limit opens none. */
  #redis: Redis | null = null;
  /** Set while a Redis outage lasts: buckets are then taken in the database at once. */
  #redisOut = false;

  constructor(storage: Storage, redisUrl: string | undefined, clock: Clock) {
    this.#storage = storage;
    this.#clock = clock;
    this.#redisUrl = redisUrl;
  }

  /** Takes one token from the key's bucket or throws 429 `spend_key_rate_limited` with Retry-After. */
  async take(key: SpendKeyRow): Promise<void> {
    const spec = bucketSpecOf(key);
    if (!spec) return;
    const redis = this.#redisClient();
    let level = redis ? await this.#takeInRedis(redis, key.id, spec) : undefined;
    if (level === undefined) {
      const outcome = await takeTokenInDatabase(this.#storage.db, key.id, spec, this.#clock.now());
      level = outcome.taken ? null : outcome.level;
    }
    if (level !== null) throw rateLimited(spec, level);
  }

  async close(): Promise<void> {
    const redis = this.#redis;
    if (redis) await redis.quit().catch(() => redis.disconnect());
  }

  #redisClient(): Redis | null {
    if (this.#redis || !this.#redisUrl) return this.#redis;
    this.#redis = new Redis(this.#redisUrl, { maxRetriesPerRequest: 2, lazyConnect: false, commandTimeout: 1_000 });
    // A lost connection is an outage the buckets ride out in the database (#takeInRedis); without a
    // listener ioredis reports every reconnection attempt as an unhandled error event.
    this.#redis.on('error', () => {
      this.#redisOut = true;
    });
    this.#redis.defineCommand('tollgateTakeToken', { numberOfKeys: 1, lua: TAKE_TOKEN_LUA });
    return this.#redis;
  }

  /**
   * The token bucket in Redis: `null` when a token was taken, else the bucket's level. `undefined`
   * when Redis cannot answer: the caller then uses the database bucket, which every instance
   * shares too, so a key's rate limit keeps holding exactly (over a separate bucket, which may
   * allow one extra burst when Redis goes away or comes back) instead of every request failing.
   */
  async #takeInRedis(redis: Redis, keyId: string, spec: BucketSpec): Promise<number | null | undefined> {
    if (this.#redisOut && redis.status !== 'ready') return undefined;
    // The settings are part of the name: changing the rate limit starts a fresh, full bucket.
    const name = `tollgate:spk:${keyId}:${spec.rpm}:${spec.burst}`;
    try {
      const [allowed, units] = await (redis as unknown as TakeTokenCommand).tollgateTakeToken(name, spec.burst * UNITS_PER_TOKEN, spec.rpm, UNITS_PER_TOKEN);
      this.#redisOut = false;
      return allowed === 1 ? null : Number(units);
    } catch {
      this.#redisOut = true;
      return undefined;
    }
  }
}

function rateLimited(spec: BucketSpec, level: number): ApiError {
  const retryAfter = retryAfterFor(spec, level);
  return new ApiError('spend_key_rate_limited', `This spend key allows ${spec.rpm} requests per minute (burst ${spec.burst}).`, {
    headers: { 'retry-after': String(retryAfter) },
  });
}

// ---------------------------------------------------------------------------------------------
// Limits: reservation at admission, settlement afterwards

type Trx = Transaction<Database>;

async function lockKey(trx: Trx, dialect: Storage['dialect'], id: string): Promise<SpendKeyRow | undefined> {
  return trx
    .selectFrom('spend_keys')
    .selectAll()
    .where('id', '=', id)
    .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
    .executeTakeFirst();
}

/** Locks spend keys in id order (PostgreSQL), as every writer that locks several does. */
export async function lockSpendKeys(trx: Trx, dialect: Storage['dialect'], ids: string[]): Promise<void> {
  const unique = [...new Set(ids)].sort();
  if (unique.length === 0 || dialect !== 'postgres') return;
  await trx.selectFrom('spend_keys').select('id').where('id', 'in', unique).orderBy('id').forUpdate().execute();
}

/** Counters rolled into the current cycle windows (an older window's counts become 0). */
function rolled(key: SpendKeyRow, now: Date) {
  const spendStart = cycleStart(key.spend_limit_cycle, now);
  const requestStart = cycleStart(key.request_limit_cycle, now);
  return {
    spend_cycle_start: spendStart,
    current_spend: key.spend_cycle_start === spendStart ? BigInt(key.current_spend) : 0n,
    request_cycle_start: requestStart,
    current_requests: key.request_cycle_start === requestStart ? BigInt(key.current_requests) : 0n,
  };
}

async function limitReachedEvent(
  trx: Trx,
  key: SpendKeyRow,
  limit: 'spend' | 'requests',
  counters: ReturnType<typeof rolled>,
  at: string,
): Promise<void> {
  const cycle = (limit === 'spend' ? key.spend_limit_cycle : key.request_limit_cycle) as Cycle;
  await enqueueEvent(trx, {
    merchantId: key.merchant_id,
    type: 'spend_key.limit_reached',
    at,
    data: {
      spend_key_id: key.id,
      wallet_id: key.wallet_id,
      limit,
      cycle,
      cycle_start: limit === 'spend' ? counters.spend_cycle_start : counters.request_cycle_start,
      ...(limit === 'spend'
        ? { spend_limit: formatMoney(BigInt(key.spend_limit_amount!)), current_spend: formatMoney(counters.current_spend) }
        : { request_limit: Number(key.request_limit_count), current_requests: Number(counters.current_requests) }),
    },
  });
}

export type Refusal = ApiError;

/** Seconds until every instance has read a changed key again (the credential cache's bound). */
const STALE_SETTINGS_RETRY_SECONDS = Math.ceil(ENTRY_TTL_MS / 1000);

/**
 * Inside the admission transaction, before the wallet is looked at: locks the key's row and runs
 * every check of the credential again on it. The credential may come from an instance's cache (up
 * to ENTRY_TTL_MS old): the locked row has the final word on revocation, rotation (a new hash),
 * pausing, expiry, shape and allow-lists, on every instance at once. The token was taken from the
 * bucket of the cached rate limit; when the row's rate limit differs the request is refused with a
 * short Retry-After, after which the new limit's bucket decides (a removed limit admits at once).
 * Returns the refusal rather than throwing, so one refusal does not undo a group commit.
 */
export async function lockSpendKeyForAdmission(
  trx: Trx,
  dialect: Storage['dialect'],
  input: { key: SpendKeyRow; request: SpendKeyRequest | null; now: Date },
): Promise<SpendKeyRow | Refusal> {
  const row = await lockKey(trx, dialect, input.key.id);
  if (!row || row.revoked_at !== null || row.key_hash !== input.key.key_hash) return unknownKey();
  try {
    checkKeyUsable(row, input.now);
    if (input.request) checkSpendKeyRequest(row, input.request);
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  const spec = bucketSpecOf(row);
  const checkedWith = bucketSpecOf(input.key);
  if (spec && (checkedWith?.rpm !== spec.rpm || checkedWith.burst !== spec.burst)) {
    return new ApiError('spend_key_rate_limited', "This spend key's rate limit just changed; retry shortly.", {
      headers: { 'retry-after': String(STALE_SETTINGS_RETRY_SECONDS) },
    });
  }
  return row;
}

/**
 * A reached request limit. A cycle's limit is 429 with the seconds until the cycle ends. A `total`
 * limit never resets, so no retry helps: 403 `request_limit_exhausted`, which none of the
 * mainstream clients retries (the Vercel AI SDK retries every 429 whatever its headers say), and
 * `x-should-retry: false` besides (decision 0021).
 */
function requestLimitReached(key: SpendKeyRow, now: Date): ApiError {
  const cycle = key.request_limit_cycle as Cycle;
  const retry = secondsUntilCycleEnd(cycle, now);
  if (retry === null) {
    return new ApiError(
      'request_limit_exhausted',
      `This spend key's request limit of ${key.request_limit_count} requests in total is used up; it never resets, so raise the limit to go on.`,
      { headers: { 'x-should-retry': 'false' } },
    );
  }
  return new ApiError('request_limit_reached', `This spend key's request limit of ${key.request_limit_count} per ${cycle} cycle is reached.`, {
    headers: { 'retry-after': String(retry) },
  });
}

/**
 * Inside the admission transaction, on the row lockSpendKeyForAdmission returned: checks the
 * request and spend limits, then counts the request and reserves `amount` (the request's hold)
 * against the remaining spend. Returns the refusal instead of throwing, so the limit_reached
 * event written here commits.
 */
export async function reserveForRequest(
  trx: Trx,
  key: SpendKeyRow,
  input: { recordId: string; amount: bigint; now: Date },
): Promise<Refusal | null> {
  const at = input.now.toISOString();
  const c = rolled(key, input.now);
  const changes: Partial<SpendKeyRow> = { ...c };

  let refusal: Refusal | null = null;
  if (key.request_limit_count !== null && c.current_requests >= BigInt(key.request_limit_count)) {
    refusal = requestLimitReached(key, input.now);
    if (key.request_event_cycle !== c.request_cycle_start) {
      await limitReachedEvent(trx, key, 'requests', c, at);
      changes.request_event_cycle = c.request_cycle_start;
    }
  } else if (key.spend_limit_amount !== null) {
    const limit = BigInt(key.spend_limit_amount);
    const committed = c.current_spend + BigInt(key.reserved_spend);
    if (committed >= limit || committed + input.amount > limit) {
      refusal = new ApiError(
        'spend_limit_reached',
        `This spend key's spend limit of ${formatMoney(limit)} per ${key.spend_limit_cycle} cycle cannot cover this request.`,
      );
      // The first refusal of a cycle is when the limit is reached for this key's callers, whether
      // or not settled spend has reached it (the last request's hold may not fit in what is left).
      if (key.spend_event_cycle !== c.spend_cycle_start) {
        await limitReachedEvent(trx, key, 'spend', c, at);
        changes.spend_event_cycle = c.spend_cycle_start;
      }
    }
  }

  if (!refusal) {
    changes.current_requests = c.current_requests + 1n;
    changes.total_requests = BigInt(key.total_requests) + 1n;
    changes.reserved_spend = BigInt(key.reserved_spend) + input.amount;
    changes.last_used_at = at;
    if (
      key.request_limit_count !== null &&
      changes.current_requests >= BigInt(key.request_limit_count) &&
      key.request_event_cycle !== c.request_cycle_start
    ) {
      await limitReachedEvent(trx, key, 'requests', { ...c, current_requests: changes.current_requests }, at);
      changes.request_event_cycle = c.request_cycle_start;
    }
    await trx
      .insertInto('spend_key_reservations')
      .values({ request_pk: input.recordId, spend_key_id: key.id, amount: input.amount, created_at: at })
      .execute();
  }
  await trx.updateTable('spend_keys').set(changes).where('id', '=', key.id).execute();
  return refusal;
}

/**
 * Ends a request's reservation inside the caller's transaction: the reserved amount is released and
 * `spend` (the actual cost; 0 for a failed request) is counted. Happens once per request: the
 * reservation row is the token, and a second call finds none.
 */
export async function finishReservation(
  trx: Trx,
  dialect: Storage['dialect'],
  recordId: string,
  spend: bigint,
  now = new Date(),
): Promise<void> {
  const reservation = await trx
    .selectFrom('spend_key_reservations')
    .selectAll()
    .where('request_pk', '=', recordId)
    .executeTakeFirst();
  if (!reservation) return;
  const key = await lockKey(trx, dialect, reservation.spend_key_id);
  const deleted = await trx.deleteFrom('spend_key_reservations').where('request_pk', '=', recordId).executeTakeFirst();
  if (!key || deleted.numDeletedRows === 0n) return;
  const at = now.toISOString();
  const c = rolled(key, now);
  const reserved = BigInt(key.reserved_spend) - BigInt(reservation.amount);
  const changes: Partial<SpendKeyRow> = {
    ...c,
    current_spend: c.current_spend + spend,
    total_spend: BigInt(key.total_spend) + spend,
    reserved_spend: reserved > 0n ? reserved : 0n,
  };
  if (
    key.spend_limit_amount !== null &&
    changes.current_spend! >= BigInt(key.spend_limit_amount) &&
    key.spend_event_cycle !== c.spend_cycle_start
  ) {
    await limitReachedEvent(trx, key, 'spend', { ...c, current_spend: changes.current_spend! }, at);
    changes.spend_event_cycle = c.spend_cycle_start;
  }
  await trx.updateTable('spend_keys').set(changes).where('id', '=', key.id).execute();
}

/**
 * Crash safety, run by the hold sweeper: ends reservations whose request is no longer pending
 * (or is gone). Settlement and failure end the reservation in the transaction that ends the
 * request, so these are left by earlier versions, which ended it in a second transaction that a
 * stopping process could miss. A completed request's reservation is swapped for the cost its
 * record shows, a failed one's for nothing. Returns how many were ended.
 */
export async function releaseOrphanedReservations(storage: Storage, now = new Date()): Promise<number> {
  const orphans = await storage.db
    .selectFrom('spend_key_reservations as r')
    .leftJoin('requests as q', 'q.id', 'r.request_pk')
    .select(['r.request_pk', 'q.status', 'q.total_wallet_cost', 'q.total_merchant_cost'])
    .where((eb) => eb.or([eb('q.id', 'is', null), eb('q.status', '!=', 'pending')]))
    .limit(1000)
    .execute();
  for (const orphan of orphans) {
    const spend = orphan.status === 'completed' ? BigInt(orphan.total_wallet_cost ?? 0n) + BigInt(orphan.total_merchant_cost ?? 0n) : 0n;
    await storage.db.transaction().execute((trx) => finishReservation(trx, storage.dialect, orphan.request_pk, spend, now));
  }
  return orphans.length;
}
