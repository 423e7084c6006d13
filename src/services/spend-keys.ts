/**
 * Spend keys: provider-style keys billed to a wallet and held to their limits. The API (merchant
 * or wallet key) and the dashboard create and change them through these operations and show them
 * with presentSpendKey. The raw key is returned on create and rotate only.
 */
import { z } from 'zod';
import { formatMoney, parseMoney } from '../domain/money.ts';
import { currentValue, CYCLES } from '../domain/spend-limits.ts';
import { ApiError, notFound, validationError, type Issue } from '../http/errors.ts';
import { assertCursor } from '../http/pagination.ts';
import { customerRef, optionalBody, positiveDecimal } from '../http/schemas.ts';
import type { Storage } from '../storage/db.ts';
import {
  findSpendKey,
  insertSpendKey,
  listSpendKeys,
  revokeSpendKey,
  rotateSpendKey,
  spendKeyIdExists,
  updateSpendKey,
  type SpendKeyRow,
  type SpendKeyScope,
  type SpendKeySettings,
} from '../storage/spend-keys.ts';
import { findMerchantWallet, type WalletRef } from '../storage/wallet-keys.ts';

const cycle = z.enum(CYCLES, { error: `must be one of ${CYCLES.join(', ')}` });
const allowList = z
  .array(z.string().trim().min(1, 'must not be empty').max(200), { error: 'must be an array of strings or null' })
  .min(1, 'must list at least one entry, or be null for no restriction')
  .max(1000);
const positiveInt = (max: number) =>
  z.number({ error: 'must be an integer' }).int('must be an integer').min(1, 'must be at least 1').max(max, `must be at most ${max}`);

const settingsFields = {
  name: z.string().trim().min(1).max(255),
  status: z.enum(['active', 'paused']),
  request_shape: z.enum(['openai', 'anthropic']),
  allowed_models: allowList.nullable(),
  allowed_providers: allowList.nullable(),
  spend_limit: z.strictObject({ amount: positiveDecimal, cycle }).nullable(),
  request_limit: z.strictObject({ count: positiveInt(1_000_000_000_000), cycle }).nullable(),
  rate_limit: z.strictObject({ rpm: positiveInt(1_000_000), burst: positiveInt(1_000_000).nullish() }).nullable(),
  expires_at: z.iso
    .datetime({ offset: true, error: 'must be an ISO 8601 date-time' })
    .nullable(),
};

const walletFields = {
  customer_id: customerRef.optional().describe('The customer id, or its reference_id'),
  connection_id: customerRef.optional(),
  wallet_id: z.string().min(1).max(100).optional(),
};

// Strict: a misspelt field (`spend_limits`) must not create a key without the limit it meant.
export const spendKeyCreateBody = optionalBody(z.strictObject({
  ...settingsFields,
  name: settingsFields.name.default('Spend key'),
  status: settingsFields.status.optional(),
  request_shape: settingsFields.request_shape.optional(),
  allowed_models: settingsFields.allowed_models.optional(),
  allowed_providers: settingsFields.allowed_providers.optional(),
  spend_limit: settingsFields.spend_limit.optional(),
  request_limit: settingsFields.request_limit.optional(),
  rate_limit: settingsFields.rate_limit.optional(),
  expires_at: settingsFields.expires_at.optional(),
  ...walletFields,
}));
export const spendKeyUpdateBody = optionalBody(z.strictObject(settingsFields).partial());

const limitSchema = (field: z.ZodType) => z.object({ amount: field, cycle }).nullable();
export const spendKeySchema = z.object({
  spend_key_id: z.string(),
  key_preview: z.string(),
  name: z.string(),
  status: z.enum(['active', 'paused']),
  request_shape: z.enum(['openai', 'anthropic']),
  wallet_id: z.string(),
  customer_id: z.string().nullable(),
  allowed_models: z.array(z.string()).nullable(),
  allowed_providers: z.array(z.string()).nullable(),
  spend_limit: limitSchema(z.string()),
  current_spend: z.string(),
  total_spend: z.string(),
  request_limit: z.object({ count: z.number().int(), cycle }).nullable(),
  current_requests: z.number().int(),
  total_requests: z.number().int(),
  rate_limit: z.object({ rpm: z.number().int(), burst: z.number().int().nullable() }).nullable(),
  expires_at: z.string().nullable(),
  last_used_at: z.string().nullable(),
  created_at: z.string(),
});
export const spendKeyWithSecret = spendKeySchema.extend({ key: z.string().describe('The raw spend key, shown only once') });

export function presentSpendKey(row: SpendKeyRow, now: Date): z.infer<typeof spendKeySchema> {
  return {
    spend_key_id: row.id,
    key_preview: row.key_preview,
    name: row.name,
    status: row.status,
    request_shape: row.request_shape,
    wallet_id: row.wallet_id,
    customer_id: row.connection_id,
    allowed_models: row.allowed_models === null ? null : (JSON.parse(row.allowed_models) as string[]),
    allowed_providers: row.allowed_providers === null ? null : (JSON.parse(row.allowed_providers) as string[]),
    spend_limit:
      row.spend_limit_amount === null
        ? null
        : { amount: formatMoney(BigInt(row.spend_limit_amount)), cycle: row.spend_limit_cycle ?? 'total' },
    current_spend: formatMoney(currentValue(BigInt(row.current_spend), row.spend_cycle_start, row.spend_limit_cycle, now)),
    total_spend: formatMoney(BigInt(row.total_spend)),
    request_limit:
      row.request_limit_count === null
        ? null
        : { count: Number(row.request_limit_count), cycle: row.request_limit_cycle ?? 'total' },
    current_requests: Number(currentValue(BigInt(row.current_requests), row.request_cycle_start, row.request_limit_cycle, now)),
    total_requests: Number(row.total_requests),
    rate_limit:
      row.rate_rpm === null ? null : { rpm: Number(row.rate_rpm), burst: row.rate_burst === null ? null : Number(row.rate_burst) },
    expires_at: row.expires_at,
    last_used_at: row.last_used_at,
    created_at: row.created_at,
  };
}

type SettingsInput = z.infer<typeof spendKeyUpdateBody>;

/** An expiry must lie ahead of the app's clock (checked here, not in the schema, which has no clock). */
export function pastExpiryIssue(expiresAt: string | null | undefined, now: Date): Issue | null {
  if (expiresAt === undefined || expiresAt === null || Date.parse(expiresAt) > now.getTime()) return null;
  return { path: ['expires_at'], message: 'must be in the future' };
}

export function assertExpiryAhead(expiresAt: string | null | undefined, now: Date): void {
  const issue = pastExpiryIssue(expiresAt, now);
  if (issue) throw validationError([issue]);
}

export function spendKeySettingsOf(body: SettingsInput): SpendKeySettings {
  const { spend_limit, rate_limit, expires_at, ...rest } = body;
  const out: SpendKeySettings = { ...rest };
  if (spend_limit !== undefined) {
    out.spend_limit = spend_limit === null ? null : { amount: parseMoney(spend_limit.amount), cycle: spend_limit.cycle };
  }
  if (rate_limit !== undefined) out.rate_limit = rate_limit === null ? null : { rpm: rate_limit.rpm, burst: rate_limit.burst ?? null };
  if (expires_at !== undefined) out.expires_at = expires_at === null ? null : new Date(expires_at).toISOString();
  return out;
}

/** Who manages spend keys: the merchant, and the wallet its wallet key is limited to (if it used one). */
export type SpendKeyCaller = { merchantId: string; merchantWalletId: string; walletKeyScope?: WalletRef | undefined };

/** A new key's settings: the same checks whether the API or the dashboard creates it. */
export async function createSpendKey(
  storage: Storage,
  caller: SpendKeyCaller,
  body: z.infer<typeof spendKeyCreateBody>,
  at: Date,
): Promise<{ row: SpendKeyRow; secret: string }> {
  const { customer_id, connection_id, wallet_id, ...settings } = body;
  assertExpiryAhead(settings.expires_at, at);
  const wallet = await walletForNewKey(storage, caller, { customer_id, connection_id, wallet_id });
  return insertSpendKey(storage.db, {
    merchantId: caller.merchantId,
    walletId: wallet.walletId,
    connectionId: wallet.connectionId,
    settings: { ...spendKeySettingsOf(settings), name: settings.name },
  }, at);
}

/** The key within the caller's scope, or a 404. */
export async function getSpendKey(storage: Storage, scope: SpendKeyScope, id: string): Promise<SpendKeyRow> {
  const row = await findSpendKey(storage, scope, id);
  if (!row) throw notFound('spend key', id);
  return row;
}

export async function changeSpendKey(storage: Storage, scope: SpendKeyScope, id: string, body: z.infer<typeof spendKeyUpdateBody>, at: Date): Promise<SpendKeyRow> {
  assertExpiryAhead(body.expires_at, at);
  const row = await updateSpendKey(storage, scope, id, spendKeySettingsOf(body), at);
  if (!row) throw notFound('spend key', id);
  return row;
}

export async function deleteSpendKey(storage: Storage, scope: SpendKeyScope, id: string, at: Date): Promise<void> {
  if (!(await revokeSpendKey(storage, scope, id, at))) throw notFound('spend key', id);
}

/** A new secret for the key; the old one stops working at once. */
export async function rotateSpendKeySecret(storage: Storage, scope: SpendKeyScope, id: string): Promise<{ row: SpendKeyRow; secret: string }> {
  const rotated = await rotateSpendKey(storage, scope, id);
  if (!rotated) throw notFound('spend key', id);
  return rotated;
}

/** A page of the keys in scope, newest first (the cursor must name one of them). */
export async function listSpendKeyPage(storage: Storage, scope: SpendKeyScope, cursor: string | undefined, limit: number): Promise<SpendKeyRow[]> {
  await assertCursor(cursor, (id) => spendKeyIdExists(storage, scope, id));
  return listSpendKeys(storage, scope, cursor, limit);
}

/** The wallet a new key belongs to: a wallet key's own; else the named customer's or wallet; else the merchant's. */
export async function walletForNewKey(
  storage: Storage,
  caller: SpendKeyCaller,
  body: { customer_id?: string | undefined; connection_id?: string | undefined; wallet_id?: string | undefined },
): Promise<WalletRef> {
  if (body.customer_id && body.connection_id && body.customer_id !== body.connection_id) {
    throw validationError([{ path: ['customer_id'], message: 'names a different customer than connection_id' }]);
  }
  const customerId = body.customer_id ?? body.connection_id;
  const field = body.customer_id ? 'customer_id' : 'connection_id';
  const merchant = { id: caller.merchantId, walletId: caller.merchantWalletId };
  let wallet: WalletRef | undefined;
  if (customerId !== undefined) {
    wallet = await findMerchantWallet(storage, merchant, { connectionId: customerId });
    if (!wallet) throw validationError([{ path: [field], message: 'names no customer of this merchant' }]);
  }
  if (body.wallet_id !== undefined) {
    const byId = await findMerchantWallet(storage, merchant, { walletId: body.wallet_id });
    if (!byId || (wallet && wallet.walletId !== byId.walletId)) {
      throw validationError([{ path: ['wallet_id'], message: byId ? 'is not the named customer\'s wallet' : 'names no wallet of this merchant' }]);
    }
    wallet = byId;
  }
  const scope = caller.walletKeyScope;
  if (scope) {
    if (wallet && wallet.walletId !== scope.walletId) {
      throw new ApiError('forbidden', "A wallet key manages only its own wallet's spend keys.");
    }
    return scope;
  }
  return wallet ?? { walletId: caller.merchantWalletId, connectionId: null };
}
