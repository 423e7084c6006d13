/**
 * A spend key's limits, decided on its locked row inside the ledger's transactions: the key is
 * checked again (revocation, rotation, pausing, expiry, shape, allow-lists, a changed rate limit),
 * the request and spend limits are checked, the request is counted and its hold reserved against
 * the key's remaining spend; settlement swaps the reservation for the actual cost.
 *
 * A refusal is data (`SpendKeyRefusal`: a stable error code, and what the client is told about
 * retrying), returned rather than thrown, so one refusal does not undo a group commit and the
 * limit_reached event written with it commits. The gateway turns it into its HTTP error.
 */
import type { Transaction } from 'kysely';
import { formatMoney } from '../domain/money.ts';
import { cycleStart, cycleWindow, secondsUntilCycleEnd, type Cycle } from '../domain/spend-limits.ts';
import type { Storage } from '../storage/db.ts';
import type { Database } from '../storage/schema.ts';
import { bucketSpecOf, type SpendKeyRow } from '../storage/spend-keys.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';
import { overrunAfterCharge, overrunAllowance, overrunEnds } from './decide/overrun.ts';
import { inLockOrder } from './decide/lock-order.ts';

export type SpendKeyRefusalCode =
  | 'unauthorized'
  | 'spend_key_expired'
  | 'spend_key_paused'
  | 'request_shape_mismatch'
  | 'provider_not_allowed'
  | 'model_not_allowed'
  | 'spend_key_rate_limited'
  | 'request_limit_reached'
  | 'request_limit_exhausted'
  | 'spend_limit_reached';

/** Why a spend key refuses a request; the gateway answers it with the code's status. */
export type SpendKeyRefusal = {
  code: SpendKeyRefusalCode;
  /** Absent: the code's standard message. */
  message?: string;
  /** Seconds until a retry can succeed (Retry-After). */
  retryAfterSeconds?: number;
  /**
   * No retry can succeed (a `total` request limit), or none before a reset too far away to wait
   * for: told as `x-should-retry: false` besides its code.
   */
  final?: true;
  /** When a reached cycle limit resets, if that is too far away for a Retry-After. */
  resetsAt?: Date;
};

/** What a spend key is checked against: the provider the request goes to and the model it names. */
export type SpendKeyRequest = { providerId: string; family: string; model: string | null; sharesAccountWith?: string | undefined };

const parseList = (json: string | null): string[] | null => (json === null ? null : (JSON.parse(json) as string[]));

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

export const unknownKey = (): SpendKeyRefusal => ({ code: 'unauthorized', message: 'Invalid or revoked spend key.' });

/** Expired → `spend_key_expired`; paused → `spend_key_paused`; null when the key may be used at `now`. */
export function unusableKeyRefusal(row: SpendKeyRow, now: Date): SpendKeyRefusal | null {
  if (row.expires_at !== null && row.expires_at <= now.toISOString()) {
    return { code: 'spend_key_expired', message: `This spend key expired at ${row.expires_at}.` };
  }
  if (row.status !== 'active') return { code: 'spend_key_paused' };
  return null;
}

/** The endpoint's shape (its provider family) against the key's → `request_shape_mismatch`. */
export function requestShapeRefusal(key: Pick<SpendKeyRow, 'request_shape'>, family: string): SpendKeyRefusal | null {
  // Gemini's native API is a third shape the two key shapes do not name: openai-shaped keys, which
  // reach Gemini models through its OpenAI-compatible path, reach them natively too.
  const shapeOk = key.request_shape === 'anthropic' ? family === 'anthropic' : family === 'openai-compatible' || family === 'google';
  if (shapeOk) return null;
  return {
    code: 'request_shape_mismatch',
    message:
      key.request_shape === 'anthropic'
        ? 'This spend key is anthropic-shaped: use POST /v1/messages.'
        : "This spend key is openai-shaped: use the OpenAI-shaped endpoints (chat completions, responses, embeddings) or Gemini's.",
  };
}

/** Checks that need no state: the endpoint shape, the provider and the model. */
export function requestRefusal(key: SpendKeyRow, request: SpendKeyRequest): SpendKeyRefusal | null {
  const shape = requestShapeRefusal(key, request.family);
  if (shape) return shape;
  if (!providerAllowed(key, request.providerId, request.sharesAccountWith)) {
    return { code: 'provider_not_allowed', message: `This spend key may not use provider ${request.providerId}.` };
  }
  if (!modelAllowed(key, request.providerId, request.model)) {
    return { code: 'model_not_allowed', message: `This spend key may not use model ${request.model ?? '(none)'}.` };
  }
  return null;
}

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
  const unique = inLockOrder(ids);
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

/**
 * How old a spend key's settings may be when a request is checked against them before admission:
 * the gateway's credential cache keeps an entry this long (decision 0008). A request refused
 * because the key's rate limit changed is told to retry once every instance has read it again.
 */
export const CREDENTIAL_STALENESS_MS = 2_000;
const STALE_SETTINGS_RETRY_SECONDS = Math.ceil(CREDENTIAL_STALENESS_MS / 1000);

/**
 * Inside the admission transaction, before the wallet is looked at: locks the key's row and runs
 * every check of the credential again on it. The credential may come from an instance's cache (up
 * to 2 s old): the locked row has the final word on revocation, rotation (a new hash), pausing,
 * expiry, shape and allow-lists, on every instance at once. The token was taken from the bucket of
 * the cached rate limit; when the row's rate limit differs the request is refused with a short
 * Retry-After, after which the new limit's bucket decides (a removed limit admits at once).
 */
export async function lockSpendKeyForAdmission(
  trx: Trx,
  dialect: Storage['dialect'],
  input: { key: SpendKeyRow; request: SpendKeyRequest | null; now: Date },
): Promise<SpendKeyRow | SpendKeyRefusal> {
  const row = await lockKey(trx, dialect, input.key.id);
  if (!row || row.revoked_at !== null || row.key_hash !== input.key.key_hash) return unknownKey();
  const refused = unusableKeyRefusal(row, input.now) ?? (input.request ? requestRefusal(row, input.request) : null);
  if (refused) return refused;
  const spec = bucketSpecOf(row);
  const checkedWith = bucketSpecOf(input.key);
  if (spec && (checkedWith?.rpm !== spec.rpm || checkedWith.burst !== spec.burst)) {
    return { code: 'spend_key_rate_limited', message: "This spend key's rate limit just changed; retry shortly.", retryAfterSeconds: STALE_SETTINGS_RETRY_SECONDS };
  }
  return row;
}

/** Whether lockSpendKeyForAdmission refused (a row has an id; a refusal a code). */
export const isSpendKeyRefusal = (locked: SpendKeyRow | SpendKeyRefusal): locked is SpendKeyRefusal => 'code' in locked;

/**
 * A reached request limit. A cycle's limit is 429 with the seconds until the cycle ends when that
 * is at most a minute away. Further away, waiting in a client is no answer (@anthropic-ai/sdk and
 * openai sleep for any Retry-After, a whole day for a daily limit): no Retry-After, `final`
 * (`x-should-retry: false`), the reset time in the message and in `resetsAt`. A `total` limit
 * never resets, so no retry helps: 403 `request_limit_exhausted`, which none of the mainstream
 * clients retries (the Vercel AI SDK retries every 429 whatever its headers say), and
 * `x-should-retry: false` besides (decision 0021).
 */
function requestLimitReached(key: SpendKeyRow, now: Date): SpendKeyRefusal {
  const cycle = key.request_limit_cycle as Cycle;
  const retry = secondsUntilCycleEnd(cycle, now);
  if (retry === null) {
    return {
      code: 'request_limit_exhausted',
      message: `This spend key's request limit of ${key.request_limit_count} requests in total is used up; it never resets, so raise the limit to go on.`,
      final: true,
    };
  }
  const reached = `This spend key's request limit of ${key.request_limit_count} per ${cycle} cycle is reached`;
  if (retry <= LONGEST_RETRY_AFTER_SECONDS) return { code: 'request_limit_reached', message: `${reached}.`, retryAfterSeconds: retry };
  const resetsAt = cycleWindow(cycle, now).end!;
  return {
    code: 'request_limit_reached',
    message: `${reached}; it will reset at ${resetsAt.toISOString()}. Do not retry before then, or raise the limit.`,
    final: true,
    resetsAt,
  };
}

/** The longest wait a refusal asks a client to sleep through (Retry-After); a later reset is told as a time instead. */
export const LONGEST_RETRY_AFTER_SECONDS = 60;

/**
 * What a spend-limited key's requests in flight and this one (`amount`) may cost beyond what they
 * reserve, when its last settled charge exceeded its reservation and requests are still in flight:
 * counted against the limit as a wallet's overrun is against its balance (decision 0025,
 * ledger/decide/admission.ts admittableOf).
 */
function overrunInFlight(key: SpendKeyRow, amount: bigint): bigint {
  return overrunAllowance(key.overrun, BigInt(key.reserved_spend), amount);
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
): Promise<SpendKeyRefusal | null> {
  const at = input.now.toISOString();
  const c = rolled(key, input.now);
  const changes: Partial<SpendKeyRow> = { ...c };

  let refusal: SpendKeyRefusal | null = null;
  if (key.request_limit_count !== null && c.current_requests >= BigInt(key.request_limit_count)) {
    refusal = requestLimitReached(key, input.now);
    if (key.request_event_cycle !== c.request_cycle_start) {
      await limitReachedEvent(trx, key, 'requests', c, at);
      changes.request_event_cycle = c.request_cycle_start;
    }
  } else if (key.spend_limit_amount !== null) {
    const limit = BigInt(key.spend_limit_amount);
    const committed = c.current_spend + BigInt(key.reserved_spend);
    const overrun = overrunInFlight(key, input.amount);
    if (overrun > 0n && committed < limit && committed + input.amount <= limit && committed + overrun + input.amount > limit) {
      refusal = {
        code: 'spend_limit_reached',
        message: `This spend key's requests cost more than they reserved; its spend limit of ${formatMoney(limit)} per ${key.spend_limit_cycle} cycle cannot cover this request and what its requests in flight may cost until they have settled.`,
      };
    } else if (committed >= limit || committed + input.amount > limit) {
      refusal = {
        code: 'spend_limit_reached',
        message: `This spend key's spend limit of ${formatMoney(limit)} per ${key.spend_limit_cycle} cycle cannot cover this request.`,
      };
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
    // Admitted with nothing reserved: whatever overran has settled, and the overrun ends.
    if (overrunEnds(key.overrun, BigInt(key.reserved_spend))) changes.overrun = 0;
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
export async function finishReservation(trx: Trx, dialect: Storage['dialect'], recordId: string, spend: bigint, now: Date): Promise<void> {
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
  // Charged more than it reserved: admissions count what its requests in flight may overrun.
  const overrun = overrunAfterCharge(spend, BigInt(reservation.amount), key.overrun);
  if (overrun !== null) changes.overrun = overrun;
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
export async function releaseOrphanedReservations(storage: Storage, now: Date): Promise<number> {
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
