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
 *     row as committed, then the wallet, then request limit → 429 `request_limit_reached`, spend
 *     limit → 402 `spend_limit_reached` (ledger/spend-key-limits.ts, which returns its refusals as
 *     data; spendKeyError answers them).
 */
import { Redis } from 'ioredis';
import { SECRET_PREFIX } from '../domain/ids.ts';
import { hashesEqual, hashSecret } from '../domain/secrets.ts';
import { bucketCapacity, retryAfterFor, UNITS_PER_TOKEN, type BucketSpec } from '../domain/spend-limits.ts';
import { ApiError } from '../http/errors.ts';
import { REDIS_CLIENT_OPTIONS, RedisBreaker } from '../http/redis-breaker.ts';
import type { Clock } from '../domain/clock.ts';
import type { Storage } from '../storage/db.ts';
import { bucketSpecOf, findSpendKeyByHash, takeTokenInDatabase, type SpendKeyRow } from '../storage/spend-keys.ts';
import {
  requestRefusal,
  requestShapeRefusal,
  unknownKey,
  unusableKeyRefusal,
  type SpendKeyRefusal,
  type SpendKeyRequest,
} from '../ledger/spend-key-limits.ts';

export const isSpendKeyToken = (token: string): boolean => token.startsWith(SECRET_PREFIX.spendKey);

/** The HTTP error a spend key's refusal (decided here or in the ledger) is answered with. */
export function spendKeyError(refusal: SpendKeyRefusal): ApiError {
  const headers: Record<string, string> = {};
  if (refusal.retryAfterSeconds !== undefined) headers['retry-after'] = String(refusal.retryAfterSeconds);
  // The official OpenAI and Anthropic clients retry a 429 unless told not to.
  if (refusal.final) headers['x-should-retry'] = 'false';
  if (refusal.resetsAt) {
    headers['x-ratelimit-reset'] = String(Math.ceil(refusal.resetsAt.getTime() / 1000));
    // The Vercel AI SDK retries every 429 whatever it is told, backing off seconds unless a
    // retry-after-ms under a minute says otherwise: told 0, it gives up at once.
    headers['retry-after-ms'] = '0';
  }
  return new ApiError(refusal.code, refusal.message, { headers });
}

/** Resolves a raw spend key to its live row, or refuses it (401 unknown/revoked/expired, 403 paused). */
export async function authenticateSpendKey(storage: Storage, token: string, now: Date): Promise<SpendKeyRow> {
  const hash = hashSecret(token);
  const row = await findSpendKeyByHash(storage, hash);
  if (!row || !hashesEqual(row.key_hash, hash)) throw spendKeyError(unknownKey());
  const unusable = unusableKeyRefusal(row, now);
  if (unusable) throw spendKeyError(unusable);
  return row;
}

/**
 * The endpoint's shape (its provider family) against the key's → 403 `request_shape_mismatch`.
 * The drop-in endpoints call it before routing the model, so a key on the wrong endpoint hears
 * about its shape rather than about the model.
 */
export function checkRequestShape(key: Pick<SpendKeyRow, 'request_shape'>, family: string): void {
  const refusal = requestShapeRefusal(key, family);
  if (refusal) throw spendKeyError(refusal);
}

/** Checks that need no state: the endpoint shape, the provider and the model. */
export function checkSpendKeyRequest(key: SpendKeyRow, request: SpendKeyRequest): void {
  const refusal = requestRefusal(key, request);
  if (refusal) throw spendKeyError(refusal);
}

// ---------------------------------------------------------------------------------------------
// Token bucket

/**
 * The token bucket of domain/spend-limits.ts (takeToken: refill, check, take) in one script run:
 * Redis runs scripts one at a time, so every instance sharing the Redis draws from one bucket. The
 * clock is Redis's own (TIME), so instances' clocks cannot disagree; ARGV[4], when given, is the
 * time instead (the property test against takeToken drives it). Returns {allowed, level}.
 */
const TAKE_TOKEN_LUA = `
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
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

type TakeTokenCommand = { tollgateTakeToken(key: string, cap: number, rate: number, cost: number, ...now: number[]): Promise<[number, string]> };

/** Makes the bucket script a command of this client (once per client). */
export function defineTakeToken(redis: Redis): void {
  redis.defineCommand('tollgateTakeToken', { numberOfKeys: 1, lua: TAKE_TOKEN_LUA });
}

/**
 * Takes one token from the bucket stored under `name`: null when taken, else the level after
 * refill. `nowMs` replaces Redis's clock (tests only).
 */
export async function takeTokenInRedis(redis: Redis, name: string, spec: BucketSpec, nowMs?: number): Promise<number | null> {
  const now = nowMs === undefined ? [] : [nowMs];
  const [allowed, units] = await (redis as unknown as TakeTokenCommand).tollgateTakeToken(name, bucketCapacity(spec), spec.rpm, UNITS_PER_TOKEN, ...now);
  return allowed === 1 ? null : Number(units);
}

/**
 * Spend keys' token buckets, owned by the app: in Redis when REDIS_URL is set (one client, opened
 * here and closed with the app), else (and while Redis is away) in the database.
 */
export class SpendKeyBuckets {
  readonly #storage: Storage;
  readonly #clock: Clock;
  readonly #redisUrl: string | undefined;
  /** Connected on the first rate-limited key, so an app whose keys have no rate limit opens none. */
  #redis: { client: Redis; breaker: RedisBreaker } | null = null;

  constructor(storage: Storage, redisUrl: string | undefined, clock: Clock) {
    this.#storage = storage;
    this.#clock = clock;
    this.#redisUrl = redisUrl;
  }

  /** Takes one token from the key's bucket or throws 429 `spend_key_rate_limited` with Retry-After. */
  async take(key: SpendKeyRow): Promise<void> {
    const spec = bucketSpecOf(key);
    if (!spec) return;
    const breaker = this.#redisBreaker();
    let level = breaker ? await this.#takeInRedis(breaker, key.id, spec) : undefined;
    if (level === undefined) {
      const outcome = await takeTokenInDatabase(this.#storage.db, key.id, spec, this.#clock.now());
      level = outcome.taken ? null : outcome.level;
    }
    if (level !== null) throw rateLimited(spec, level);
  }

  async close(): Promise<void> {
    if (!this.#redis) return;
    const { client, breaker } = this.#redis;
    breaker.close();
    if (client.status === 'ready') await client.quit().catch(() => client.disconnect());
    else client.disconnect();
  }

  #redisBreaker(): RedisBreaker | null {
    if (this.#redis || !this.#redisUrl) return this.#redis?.breaker ?? null;
    const client = new Redis(this.#redisUrl, REDIS_CLIENT_OPTIONS);
    // A lost connection is an outage the buckets ride out in the database (#takeInRedis); without a
    // listener ioredis reports every reconnection attempt as an unhandled error event.
    client.on('error', () => {});
    defineTakeToken(client);
    this.#redis = { client, breaker: new RedisBreaker(client) };
    return this.#redis.breaker;
  }

  /**
   * The token bucket in Redis: `null` when a token was taken, else the bucket's level. `undefined`
   * when Redis cannot answer in time (or its breaker is open, decision 0025): the caller then uses
   * the database bucket, which every instance shares too, so a key's rate limit keeps holding
   * exactly (over a separate bucket, which may allow one extra burst when Redis goes away or comes
   * back) instead of every request failing or waiting.
   */
  async #takeInRedis(breaker: RedisBreaker, keyId: string, spec: BucketSpec): Promise<number | null | undefined> {
    // The settings are part of the name: changing the rate limit starts a fresh, full bucket.
    const name = `tollgate:spk:${keyId}:${spec.rpm}:${spec.burst}`;
    return breaker.run((redis) => takeTokenInRedis(redis, name, spec)).catch(() => undefined);
  }
}

function rateLimited(spec: BucketSpec, level: number): ApiError {
  const retryAfter = retryAfterFor(spec, level);
  return new ApiError('spend_key_rate_limited', `This spend key allows ${spec.rpm} requests per minute (burst ${spec.burst}).`, {
    headers: { 'retry-after': String(retryAfter) },
  });
}
