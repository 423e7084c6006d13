import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { newId, newSecret } from '../domain/ids.ts';
import {
  deserializeTiers,
  isTierList,
  PAYERS,
  parseTiers,
  RATE_TYPES,
  serializeTiers,
  slugify,
  TIER_TYPES,
  TOKEN_BASES,
  type Tier,
} from '../domain/meters.ts';
import { formatMoney } from '../domain/money.ts';
import { principalOf } from '../http/auth.ts';
import { ApiError, notFound, validationError } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, idParams, optionalBody, standardErrors } from '../http/schemas.ts';
import { nowIsoOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  findMeter,
  insertMeter,
  listMeters,
  softDeleteMeter,
  updateMeter,
  type MeterRow,
} from '../storage/meters.ts';
import { merchantHasRow } from '../storage/pages.ts';

const tierInput = z.object({
  start: z.union([z.string(), z.number()], { error: 'start must be a non-negative integer' }),
  rate: z.string({ error: 'rate must be a decimal string' }),
});
const tiersInput = z.array(tierInput).min(1, 'at least one tier is required').max(100, 'at most 100 tiers');

const slugSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,63}$/i, 'meter_slug must be 1-64 letters, digits, - or _, starting alphanumeric');

const createBody = z.object({
  name: z.string().trim().min(1).max(255),
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
const updateBody = optionalBody(
  z.strictObject({ name: z.string().trim().min(1).max(255).optional(), tiers: tiersInput.optional() }),
);

const tierSchema = z.object({ start: z.number(), rate: z.string(), type: z.enum(TIER_TYPES) });
const meterSchema = z.object({
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
type Meter = z.infer<typeof meterSchema>;

const tags = ['meters'];

function present(row: MeterRow): Meter {
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

function checkedTiers(input: z.infer<typeof tiersInput>): Tier[] {
  const parsed = parseTiers(input);
  if (isTierList(parsed)) return parsed;
  throw validationError(
    parsed.map((p) => ({
      path: ['tiers', String(p.index), ...(p.field ? [p.field] : [])],
      message: p.message,
    })),
  );
}

export function registerMeterRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  app.get(
    '/meters',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(meterSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'meters', merchantId, id));
      return toPage(await listMeters(storage, merchantId, cursor, limit), limit, present);
    },
  );

  app.post(
    '/meters',
    { schema: { tags, body: createBody, response: { 201: meterSchema, ...standardErrors } } },
    async (request, reply) => {
      const { merchantId } = principalOf(request);
      const body = request.body;
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
        created_at: nowIsoOf(deps),
        deleted_at: null,
      };
      const row = await insertWithSlug(storage, base, body.meter_slug);
      return reply.status(201).send(present(row));
    },
  );

  app.get(
    '/meters/:id',
    { schema: { tags, params: idParams, response: { 200: meterSchema, ...standardErrors } } },
    async (request) => {
      const row = await findMeter(storage, principalOf(request).merchantId, request.params.id);
      if (!row) throw notFound('meter', request.params.id);
      return present(row);
    },
  );

  app.patch(
    '/meters/:id',
    { schema: { tags, params: idParams, body: updateBody, response: { 200: meterSchema, ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { name, tiers } = request.body;
      const changes: Partial<Pick<MeterRow, 'name' | 'tiers'>> = {};
      if (name !== undefined) changes.name = name;
      if (tiers !== undefined) changes.tiers = serializeTiers(checkedTiers(tiers));
      const row = await updateMeter(storage, merchantId, request.params.id, changes);
      if (!row) throw notFound('meter', request.params.id);
      return present(row);
    },
  );

  app.delete(
    '/meters/:id',
    { schema: { tags, params: idParams, response: { 200: deletedResponse, ...standardErrors } } },
    async (request) => {
      const deleted = await softDeleteMeter(storage, principalOf(request).merchantId, request.params.id, nowIsoOf(deps));
      if (!deleted) throw notFound('meter', request.params.id);
      return { id: request.params.id, deleted: true as const };
    },
  );
}

/**
 * A slug the caller chose must be free (409 otherwise). A slug derived from the name gets a
 * short random suffix when the plain one is taken.
 */
async function insertWithSlug(
  storage: AppDeps['storage'],
  base: Omit<MeterRow, 'slug'>,
  requested: string | undefined,
): Promise<MeterRow> {
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
