/**
 * Meters: the prices a merchant charges (rate type, unit, tiers, who pays what). The API's
 * /v1/meters and the dashboard's meter pages both create, change and show a meter through these.
 */
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import type { AppDeps } from '../app-deps.ts';
import { dateOf } from '../domain/clock.ts';
import { newId, newSecret } from '../domain/ids.ts';
import { deserializeTiers, isTierList, PAYERS, parseTiers, RATE_TYPES, serializeTiers, slugify, TIER_TYPES, TOKEN_BASES, type Tier } from '../domain/meters.ts';
import { formatMoney } from '../domain/money.ts';
import { ApiError, notFound, validationError } from '../http/errors.ts';
import { assertCursor } from '../http/pagination.ts';
import { optionalBody } from '../http/schemas.ts';
import type { Storage } from '../storage/db.ts';
import { findMeter, insertMeter, listMeters, softDeleteMeter, updateMeter, type MeterRow } from '../storage/meters.ts';
import { merchantHasRow } from '../storage/pages.ts';

const tierInput = z.object({
  start: z.union([z.string(), z.number()], { error: 'start must be a non-negative integer' }),
  rate: z.string({ error: 'rate must be a decimal string' }),
});
export const tiersInput = z.array(tierInput).min(1, 'at least one tier is required').max(100, 'at most 100 tiers');

const slugSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,63}$/i, 'meter_slug must be 1-64 letters, digits, - or _, starting alphanumeric');

const meterName = z.string().trim().min(1).max(255);

export const meterCreateBody = z.object({
  name: meterName,
  meter_slug: slugSchema.optional(),
  rate_type: z.enum(RATE_TYPES),
  tier_type: z.enum(TIER_TYPES).default('tokens_1m'),
  token_basis: z.enum(TOKEN_BASES).default('input+output'),
  base_cost_payer: z.enum(PAYERS).default('wallet'),
  service_charge_payer: z.enum(PAYERS).default('wallet'),
  tiers: tiersInput,
});

// Strict: a field an update cannot change (rate_type, meter_slug, …) is refused, never silently
// dropped, as on spend keys.
export const meterUpdateBody = optionalBody(z.strictObject({ name: meterName.optional(), tiers: tiersInput.optional() }));

const tierSchema = z.object({ start: z.number(), rate: z.string(), type: z.enum(TIER_TYPES) });
export const meterSchema = z.object({
  meter_id: z.string(),
  product_id: z.string().describe('Older name of meter_id'),
  meter_slug: z.string(),
  name: z.string(),
  rate_type: z.enum(RATE_TYPES),
  tier_type: z.enum(TIER_TYPES),
  token_basis: z.enum(TOKEN_BASES),
  base_cost_payer: z.enum(PAYERS),
  service_charge_payer: z.enum(PAYERS),
  tiers: z.array(tierSchema),
  product_secret: z.string().describe('Secret the older forward token and request body use'),
  created_at: z.string(),
});
export type Meter = z.infer<typeof meterSchema>;

export function presentMeter(row: MeterRow): Meter {
  return {
    meter_id: row.id,
    product_id: row.id,
    meter_slug: row.slug,
    name: row.name,
    rate_type: row.rate_type,
    tier_type: row.tier_type,
    token_basis: row.token_basis,
    base_cost_payer: row.base_cost_payer,
    service_charge_payer: row.service_charge_payer,
    tiers: deserializeTiers(row.tiers).map((t) => ({ start: t.start, rate: formatMoney(t.rate), type: row.tier_type })),
    product_secret: row.secret,
    created_at: row.created_at,
  };
}

/** The tiers of a body, checked by the pricing rules; a problem names its tier and field. */
export function checkedTiers(input: z.infer<typeof tiersInput>): Tier[] {
  const parsed = parseTiers(input);
  if (isTierList(parsed)) return parsed;
  throw validationError(
    parsed.map((p) => ({
      path: ['tiers', String(p.index), ...(p.field ? [p.field] : [])],
      message: p.message,
    })),
  );
}

type Deps = Pick<AppDeps, 'storage' | 'clock'>;

/** A page of the merchant's meters, newest first (the cursor must name one of them). */
export async function listMeterPage(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<MeterRow[]> {
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'meters', merchantId, id));
  return listMeters(storage, merchantId, cursor, limit);
}

/** The live meter, or a 404. */
export async function getMeter(storage: Storage, merchantId: string, id: string): Promise<MeterRow> {
  const row = await findMeter(storage, merchantId, id);
  if (!row) throw notFound('meter', id);
  return row;
}

/** POST /meters and the dashboard's meter form: the tiers checked, a free slug found (409 when a chosen one is taken). */
export async function createMeter(deps: Deps, merchantId: string, body: z.infer<typeof meterCreateBody>): Promise<MeterRow> {
  const tiers = checkedTiers(body.tiers);
  const base: Omit<MeterRow, 'slug'> = {
    id: newId('meter'),
    merchant_id: merchantId,
    name: body.name,
    secret: newSecret('meter'),
    rate_type: body.rate_type,
    tier_type: body.tier_type,
    token_basis: body.token_basis,
    base_cost_payer: body.base_cost_payer,
    service_charge_payer: body.service_charge_payer,
    tiers: serializeTiers(tiers),
    created_at: dateOf(deps.clock).toISOString(),
    deleted_at: null,
  };
  return insertWithSlug(deps.storage, base, body.meter_slug);
}

/** PATCH /meters/{id} and the dashboard's meter edit: name and tiers only. */
export async function changeMeter(storage: Storage, merchantId: string, id: string, body: z.infer<typeof meterUpdateBody>): Promise<MeterRow> {
  const { name, tiers } = body;
  const changes: Partial<Pick<MeterRow, 'name' | 'tiers'>> = {};
  if (name !== undefined) changes.name = name;
  if (tiers !== undefined) changes.tiers = serializeTiers(checkedTiers(tiers));
  const row = await updateMeter(storage, merchantId, id, changes);
  if (!row) throw notFound('meter', id);
  return row;
}

export async function deleteMeter(deps: Deps, merchantId: string, id: string): Promise<void> {
  if (!(await softDeleteMeter(deps.storage, merchantId, id, dateOf(deps.clock).toISOString()))) throw notFound('meter', id);
}

/**
 * A slug the caller chose must be free (409 otherwise). A slug derived from the name gets a
 * short random suffix when the plain one is taken.
 */
async function insertWithSlug(storage: Storage, base: Omit<MeterRow, 'slug'>, requested: string | undefined): Promise<MeterRow> {
  if (requested !== undefined) {
    const row = { ...base, slug: requested };
    if ((await insertMeter(storage, row)) === 'slug_taken') {
      throw new ApiError('meter_slug_taken', `The meter_slug "${requested}" is already in use.`);
    }
    return row;
  }
  const plain = slugify(base.name);
  for (const slug of [plain, ...Array.from({ length: 5 }, () => `${plain}-${randomBytes(3).toString('hex')}`)]) {
    const row = { ...base, slug };
    if ((await insertMeter(storage, row)) === 'ok') return row;
  }
  throw new ApiError('meter_slug_taken', 'Could not find a free slug; pass meter_slug.');
}
