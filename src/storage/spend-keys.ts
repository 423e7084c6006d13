import { sql, type Kysely, type Transaction } from 'kysely';
import { newId, newSecret, SECRET_PREFIX } from '../domain/ids.ts';
import { hashSecret, secretHint } from '../domain/secrets.ts';
import { bucketCapacity, currentValue, cycleStart, refill, UNITS_PER_TOKEN, type BucketSpec, type Cycle } from '../domain/spend-limits.ts';
import type { Storage } from './db.ts';
import type { Database, SpendKeysTable } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type SpendKeyRow = SpendKeysTable;
type Db = Kysely<Database> | Transaction<Database>;

/** The settings a caller may set; undefined = leave as is (update) or default (create). */
export type SpendKeySettings = {
  name?: string;
  status?: 'active' | 'paused';
  request_shape?: 'openai' | 'anthropic';
  allowed_models?: string[] | null;
  allowed_providers?: string[] | null;
  spend_limit?: { amount: bigint; cycle: Cycle } | null;
  request_limit?: { count: number; cycle: Cycle } | null;
  rate_limit?: { rpm: number; burst: number | null } | null;
  expires_at?: string | null;
};

export function bucketSpecOf(row: Pick<SpendKeyRow, 'rate_rpm' | 'rate_burst'>): BucketSpec | null {
  if (row.rate_rpm === null) return null;
  const rpm = Number(row.rate_rpm);
  return { rpm, burst: row.rate_burst === null ? rpm : Number(row.rate_burst) };
}

function settingsColumns(s: SpendKeySettings): Partial<SpendKeyRow> {
  const out: Partial<SpendKeyRow> = {};
  if (s.name !== undefined) out.name = s.name;
  if (s.status !== undefined) out.status = s.status;
  if (s.request_shape !== undefined) out.request_shape = s.request_shape;
  if (s.allowed_models !== undefined) out.allowed_models = s.allowed_models === null ? null : JSON.stringify(s.allowed_models);
  if (s.allowed_providers !== undefined) {
    out.allowed_providers = s.allowed_providers === null ? null : JSON.stringify(s.allowed_providers);
  }
  if (s.spend_limit !== undefined) {
    out.spend_limit_amount = s.spend_limit?.amount ?? null;
    out.spend_limit_cycle = s.spend_limit?.cycle ?? null;
  }
  if (s.request_limit !== undefined) {
    out.request_limit_count = s.request_limit === null ? null : BigInt(s.request_limit.count);
    out.request_limit_cycle = s.request_limit?.cycle ?? null;
  }
  if (s.rate_limit !== undefined) {
    out.rate_rpm = s.rate_limit === null ? null : BigInt(s.rate_limit.rpm);
    out.rate_burst = s.rate_limit?.burst == null ? null : BigInt(s.rate_limit.burst);
  }
  if (s.expires_at !== undefined) out.expires_at = s.expires_at;
  return out;
}

/** A full bucket, stamped now: a new or re-limited key starts with its whole burst. */
function fullBucket(row: Pick<SpendKeyRow, 'rate_rpm' | 'rate_burst'>, nowMs: number) {
  const spec = bucketSpecOf(row);
  return { bucket_units: BigInt(spec ? bucketCapacity(spec) : 0), bucket_at_ms: BigInt(nowMs) };
}

export async function insertSpendKey(
  db: Db,
  input: { merchantId: string; walletId: string; connectionId: string | null; settings: SpendKeySettings & { name: string } },
  now: Date,
): Promise<{ row: SpendKeyRow; secret: string }> {
  const secret = newSecret('spendKey');
  const s = settingsColumns(input.settings);
  const base = {
    id: newId('spendKey'),
    merchant_id: input.merchantId,
    wallet_id: input.walletId,
    connection_id: input.connectionId,
    name: input.settings.name,
    status: 'active' as const,
    request_shape: 'openai' as const,
    key_hash: hashSecret(secret),
    key_preview: secretHint(secret, SECRET_PREFIX.spendKey),
    allowed_models: null,
    allowed_providers: null,
    spend_limit_amount: null,
    spend_limit_cycle: null,
    request_limit_count: null,
    request_limit_cycle: null,
    rate_rpm: null,
    rate_burst: null,
    expires_at: null,
    ...s,
  };
  const row: SpendKeyRow = {
    ...base,
    spend_cycle_start: cycleStart(base.spend_limit_cycle, now),
    current_spend: 0n,
    reserved_spend: 0n,
    total_spend: 0n,
    request_cycle_start: cycleStart(base.request_limit_cycle, now),
    current_requests: 0n,
    total_requests: 0n,
    spend_event_cycle: null,
    request_event_cycle: null,
    ...fullBucket(base, now.getTime()),
    last_used_at: null,
    created_at: now.toISOString(),
    revoked_at: null,
  };
  await db.insertInto('spend_keys').values(row).execute();
  return { row, secret };
}

/** Scope of a management call: the merchant, and for a wallet key also its wallet. */
export type SpendKeyScope = { merchantId: string; walletId: string | null };

function scoped(db: Db, scope: SpendKeyScope) {
  return db
    .selectFrom('spend_keys')
    .where('merchant_id', '=', scope.merchantId)
    .where('revoked_at', 'is', null)
    .$if(scope.walletId !== null, (q) => q.where('wallet_id', '=', scope.walletId!));
}

export async function findSpendKey(storage: Storage, scope: SpendKeyScope, id: string): Promise<SpendKeyRow | undefined> {
  return scoped(storage.db, scope).selectAll().where('id', '=', id).executeTakeFirst();
}

export async function listSpendKeys(storage: Storage, scope: SpendKeyScope, cursor: string | undefined, limit: number) {
  return scoped(storage.db, scope)
    .selectAll()
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}

export async function spendKeyIdExists(storage: Storage, scope: SpendKeyScope, id: string): Promise<boolean> {
  return (await scoped(storage.db, scope).select('id').where('id', '=', id).executeTakeFirst()) !== undefined;
}

/**
 * Applies new settings. Counters keep counting whether or not a limit is set: when a limit's
 * cycle changes (a limit added, removed or given another cycle) its counter moves to the new
 * window carrying what it holds (see carriedCounter); changing the rate limit refills the bucket.
 */
export async function updateSpendKey(
  { db, dialect }: Storage,
  scope: SpendKeyScope,
  id: string,
  settings: SpendKeySettings,
  now: Date,
): Promise<SpendKeyRow | undefined> {
  return db.transaction().execute(async (trx) => {
    const row = await scoped(trx, scope)
      .selectAll()
      .where('id', '=', id)
      .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
      .executeTakeFirst();
    if (!row) return undefined;
    const changes = settingsColumns(settings);
    const next = { ...row, ...changes };
    if (next.spend_limit_cycle !== row.spend_limit_cycle) {
      const start = cycleStart(next.spend_limit_cycle, now);
      const spend = currentValue(BigInt(row.current_spend), row.spend_cycle_start, row.spend_limit_cycle, now);
      Object.assign(changes, { spend_cycle_start: start, current_spend: carriedCounter(row, spend, start), spend_event_cycle: null });
    }
    if (next.request_limit_cycle !== row.request_limit_cycle) {
      const start = cycleStart(next.request_limit_cycle, now);
      const requests = currentValue(BigInt(row.current_requests), row.request_cycle_start, row.request_limit_cycle, now);
      Object.assign(changes, { request_cycle_start: start, current_requests: carriedCounter(row, requests, start), request_event_cycle: null });
    }
    if (next.rate_rpm !== row.rate_rpm || next.rate_burst !== row.rate_burst) Object.assign(changes, fullBucket(next, now.getTime()));
    if (next.spend_limit_amount !== row.spend_limit_amount) changes.spend_event_cycle = null;
    if (next.request_limit_count !== row.request_limit_count) changes.request_event_cycle = null;
    if (Object.keys(changes).length > 0) await trx.updateTable('spend_keys').set(changes).where('id', '=', id).execute();
    return { ...row, ...changes };
  });
}

/**
 * A counter's value in its new window: 0 when the key was not used since the new window began
 * (exact), else what the counter holds. That is exact for a key created inside the new window.
 * Otherwise there is no per-window history to recount from: moving to a narrower window (a total
 * or monthly count to daily) keeps use from before the window began, so the new cap counts a
 * little too much and never lets the key overspend; moving to a wider one (daily to monthly)
 * keeps only what the narrower window counted.
 */
function carriedCounter(row: Pick<SpendKeyRow, 'last_used_at'>, value: bigint, newStart: string): bigint {
  return row.last_used_at !== null && row.last_used_at >= newStart ? value : 0n;
}

export async function revokeSpendKey(storage: Storage, scope: SpendKeyScope, id: string, now: Date): Promise<boolean> {
  const result = await storage.db
    .updateTable('spend_keys')
    .set({ revoked_at: now.toISOString() })
    .where('id', '=', id)
    .where('merchant_id', '=', scope.merchantId)
    .where('revoked_at', 'is', null)
    .$if(scope.walletId !== null, (q) => q.where('wallet_id', '=', scope.walletId!))
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

/** Replaces the secret: the old one stops matching the moment this commits. */
export async function rotateSpendKey(
  storage: Storage,
  scope: SpendKeyScope,
  id: string,
): Promise<{ row: SpendKeyRow; secret: string } | undefined> {
  const secret = newSecret('spendKey');
  const set = { key_hash: hashSecret(secret), key_preview: secretHint(secret, SECRET_PREFIX.spendKey) };
  const result = await storage.db
    .updateTable('spend_keys')
    .set(set)
    .where('id', '=', id)
    .where('merchant_id', '=', scope.merchantId)
    .where('revoked_at', 'is', null)
    .$if(scope.walletId !== null, (q) => q.where('wallet_id', '=', scope.walletId!))
    .executeTakeFirst();
  if (result.numUpdatedRows === 0n) return undefined;
  const row = await findSpendKey(storage, scope, id);
  return row ? { row, secret } : undefined;
}

/** A live (not revoked) key by the hash of its secret. */
export async function findSpendKeyByHash(storage: Storage, keyHash: string): Promise<SpendKeyRow | undefined> {
  return storage.db
    .selectFrom('spend_keys')
    .selectAll()
    .where('key_hash', '=', keyHash)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
}

// ---------------------------------------------------------------------------------------------
// Token bucket, database mode

/**
 * The token bucket of domain/spend-limits.ts (takeToken: refill, check, take), in one conditional
 * UPDATE: the refill, the check and the take happen in one statement under the row's lock, so any
 * number of instances sharing the database draw from one bucket. Property-tested against takeToken
 * (test/spend-keys/token-bucket.property.test.ts). Returns the level after refill when refused
 * (for Retry-After).
 */
export async function takeTokenInDatabase(
  db: Kysely<Database>,
  id: string,
  spec: BucketSpec,
  nowMs: number,
): Promise<{ taken: true } | { taken: false; level: number }> {
  const cap = BigInt(bucketCapacity(spec));
  const now = BigInt(nowMs);
  const rpm = BigInt(spec.rpm);
  const token = BigInt(UNITS_PER_TOKEN);
  // refill(): what the bucket holds now (a clock going back refills nothing), at most its capacity.
  const refilled = sql<bigint>`bucket_units + (case when ${now} > bucket_at_ms then (${now} - bucket_at_ms) * ${rpm} else 0 end)`;
  const level = sql<bigint>`(case when ${refilled} > ${cap} then ${cap} else ${refilled} end)`;
  const result = await db
    .updateTable('spend_keys')
    .set({
      bucket_units: sql`${level} - ${token}`,
      bucket_at_ms: sql`case when ${now} > bucket_at_ms then ${now} else bucket_at_ms end`,
    })
    .where('id', '=', id)
    .where(sql<boolean>`${level} >= ${token}`)
    .executeTakeFirst();
  if (result.numUpdatedRows > 0n) return { taken: true };
  const row = await db.selectFrom('spend_keys').select(['bucket_units', 'bucket_at_ms']).where('id', '=', id).executeTakeFirst();
  if (!row) return { taken: false, level: 0 };
  return { taken: false, level: refill(spec, Number(row.bucket_units), Number(row.bucket_at_ms), nowMs) };
}
