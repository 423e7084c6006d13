/**
 * Enforcement of spend keys on every use (drop-in endpoints and /v1/forward).
 *
 * Order of checks, each with its own code:
 *  1. the key: unknown or revoked → 401 `unauthorized`; expired → 401 `spend_key_expired`;
 *     paused → 403 `spend_key_paused` (authenticateSpendKey, at credential resolution);
 *  2. the request: endpoint shape → 403 `request_shape_mismatch`; provider → 403
 *     `provider_not_allowed`; model → 403 `model_not_allowed` (checkSpendKeyRequest; no state);
 *  3. the token bucket → 429 `spend_key_rate_limited` with Retry-After (takeRateToken: a Redis Lua
 *     script when REDIS_URL is set, else one conditional UPDATE; both atomic across instances);
 *  4. inside the admission transaction, with the key's row locked: request limit → 429
 *     `request_limit_reached`, spend limit → 402 `spend_limit_reached` (reserveForRequest). The
 *     request's hold estimate is reserved against the key's remaining spend, so concurrent
 *     requests can never overshoot; settlement swaps the reservation for the actual cost.
 */
import type { Transaction } from 'kysely';
import { Redis } from 'ioredis';
import { SECRET_PREFIX } from '../domain/ids.ts';
import { formatMoney } from '../domain/money.ts';
import { hashesEqual, hashSecret } from '../domain/secrets.ts';
import { cycleStart, retryAfterFor, secondsUntilCycleEnd, UNITS_PER_TOKEN, type BucketSpec, type Cycle } from '../domain/spend-limits.ts';
import { ApiError } from '../http/errors.ts';
import type { Config } from '../config.ts';
import type { Storage } from '../storage/db.ts';
import type { Database } from '../storage/schema.ts';
import { bucketSpecOf, findSpendKeyByHash, takeTokenInDatabase, type SpendKeyRow } from '../storage/spend-keys.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';

export const isSpendKeyToken = (token: string): boolean => token.startsWith(SECRET_PREFIX.spendKey);

/** Resolves a raw spend key to its live row, or refuses it (401 unknown/revoked/expired, 403 paused). */
export async function authenticateSpendKey(storage: Storage, token: string, now = new Date()): Promise<SpendKeyRow> {
  const hash = hashSecret(token);
  const row = await findSpendKeyByHash(storage, hash);
  if (!row || !hashesEqual(row.key_hash, hash)) throw new ApiError('unauthorized', 'Invalid or revoked spend key.');
  if (row.expires_at !== null && row.expires_at <= now.toISOString()) {
    throw new ApiError('spend_key_expired', `This spend key expired at ${row.expires_at}.`);
  }
  if (row.status !== 'active') throw new ApiError('spend_key_paused');
  return row;
}

export const parseList = (json: string | null): string[] | null => (json === null ? null : (JSON.parse(json) as string[]));

/** Whether an allow-list admits a model (as routed, or written `provider/model`). */
export function modelAllowed(key: Pick<SpendKeyRow, 'allowed_models'>, providerId: string, model: string | null): boolean {
  const allowed = parseList(key.allowed_models);
  if (allowed === null) return true;
  if (model === null) return false;
  return allowed.includes(model) || allowed.includes(`${providerId}/${model}`);
}

export function providerAllowed(key: Pick<SpendKeyRow, 'allowed_providers'>, providerId: string): boolean {
  const allowed = parseList(key.allowed_providers);
  return allowed === null || allowed.includes(providerId) || (providerId === 'google-openai' && allowed.includes('google'));
}

/** Checks that need no state: the endpoint shape, the provider and the model. */
export function checkSpendKeyRequest(
  key: SpendKeyRow,
  request: { providerId: string; family: string; model: string | null },
): void {
  const shapeOk = key.request_shape === 'anthropic' ? request.family === 'anthropic' : request.family === 'openai-compatible';
  if (!shapeOk) {
    throw new ApiError(
      'request_shape_mismatch',
      key.request_shape === 'anthropic'
        ? 'This spend key is anthropic-shaped: use POST /v1/messages.'
        : 'This spend key is openai-shaped: use the OpenAI-shaped endpoints (chat completions, responses, embeddings).',
    );
  }
  if (!providerAllowed(key, request.providerId)) {
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

const redisClients = new WeakMap<Config, Redis>();

function redisFor(config: Config): Redis | null {
  if (!config.redisUrl) return null;
  let client = redisClients.get(config);
  if (!client) {
    client = new Redis(config.redisUrl, { maxRetriesPerRequest: 2, lazyConnect: false });
    client.defineCommand('tollgateTakeToken', { numberOfKeys: 1, lua: TAKE_TOKEN_LUA });
    redisClients.set(config, client);
  }
  return client;
}

/** Closes the Redis connection the guard opened for this configuration, if any. */
export async function closeSpendKeyGuard(config: Config): Promise<void> {
  const client = redisClients.get(config);
  if (!client) return;
  redisClients.delete(config);
  await client.quit().catch(() => client.disconnect());
}

type TakeTokenCommand = { tollgateTakeToken(key: string, cap: number, rate: number, cost: number): Promise<[number, string]> };

/** Takes one token from the key's bucket or throws 429 `spend_key_rate_limited` with Retry-After. */
export async function takeRateToken(storage: Storage, config: Config, key: SpendKeyRow): Promise<void> {
  const spec = bucketSpecOf(key);
  if (!spec) return;
  const redis = redisFor(config);
  let level: number | null;
  if (redis) {
    // The settings are part of the name: changing the rate limit starts a fresh, full bucket.
    const name = `tollgate:spk:${key.id}:${spec.rpm}:${spec.burst}`;
    const [allowed, units] = await (redis as unknown as TakeTokenCommand).tollgateTakeToken(
      name,
      spec.burst * UNITS_PER_TOKEN,
      spec.rpm,
      UNITS_PER_TOKEN,
    );
    level = allowed === 1 ? null : Number(units);
  } else {
    const outcome = await takeTokenInDatabase(storage.db, key.id, spec, Date.now());
    level = outcome.taken ? null : outcome.level;
  }
  if (level !== null) throw rateLimited(spec, level);
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

/**
 * Inside the admission transaction: checks the request and spend limits with the key's row locked,
 * then counts the request and reserves `amount` (the request's hold) against the remaining spend.
 * Returns the refusal instead of throwing, so the limit_reached event written here commits.
 */
export async function reserveForRequest(
  trx: Trx,
  dialect: Storage['dialect'],
  input: { keyId: string; keyHash: string; recordId: string; amount: bigint; now: Date },
): Promise<Refusal | null> {
  const key = await lockKey(trx, dialect, input.keyId);
  // The credential may come from an instance's cache: the locked row has the final word on
  // revocation, rotation (a new hash) and pausing, on every instance at once.
  if (!key || key.revoked_at !== null || key.key_hash !== input.keyHash) {
    return new ApiError('unauthorized', 'Invalid or revoked spend key.');
  }
  if (key.status !== 'active') return new ApiError('spend_key_paused');
  const at = input.now.toISOString();
  const c = rolled(key, input.now);
  const changes: Partial<SpendKeyRow> = { ...c };

  let refusal: Refusal | null = null;
  if (key.request_limit_count !== null && c.current_requests >= BigInt(key.request_limit_count)) {
    const retry = secondsUntilCycleEnd(key.request_limit_cycle as Cycle, input.now);
    refusal = new ApiError('request_limit_reached', `This spend key's request limit of ${key.request_limit_count} per ${key.request_limit_cycle} cycle is reached.`, {
      headers: retry === null ? {} : { 'retry-after': String(retry) },
    });
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
      if (c.current_spend >= limit && key.spend_event_cycle !== c.spend_cycle_start) {
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

/** finishReservation in its own transaction (after a settlement's charge committed). */
export async function settleReservation(storage: Storage, recordId: string, spend: bigint): Promise<void> {
  await storage.db.transaction().execute((trx) => finishReservation(trx, storage.dialect, recordId, spend));
}
