/**
 * Usage records (the requests Tollgate charged): recording one a merchant reports (POST
 * /v1/requests: charged in one step through the ledger's charge batch, after an auto top-up if
 * the wallet has one), reading and listing them, how the API, the dashboard and its CSV export
 * show one, and the filters GET /requests and GET /usage share.
 */
import { createHash } from 'node:crypto';
import type { FastifyBaseLogger } from 'fastify';
import { z } from 'zod';
import type { AppDeps } from '../app-deps.ts';
import { admitWithAutoTopUp } from '../commerce/auto-top-up.ts';
import { lookupBasePrices } from '../domain/base-prices.ts';
import { dateOf } from '../domain/clock.ts';
import { formatMoney } from '../domain/money.ts';
import { formatMicros, secondsToMicros, toSeconds, type Usage } from '../domain/pricing.ts';
import type { Principal } from '../http/auth.ts';
import { ApiError, notFound, validationError } from '../http/errors.ts';
import { metadataFiltersSchema, metadataSchema, parseJsonParam } from '../http/metadata.ts';
import { assertCursor, pageQuery, toPage, type Page } from '../http/pagination.ts';
import { customerRef } from '../http/schemas.ts';
import type { BalanceShortfall, ChargeInput } from '../ledger/charge.ts';
import { CHARGE_JOB, chargeWriter } from '../ledger/charge-batch.ts';
import type { UnwrittenHolds } from '../ledger/wallets.ts';
import { BUILTIN_PROVIDERS } from '../providers/builtin.ts';
import type { ProviderModule } from '../providers/types.ts';
import { reportsOf, type Storage } from '../storage/db.ts';
import { resolveCustomerId } from '../storage/connections.ts';
import type { MeterRow } from '../storage/meters.ts';
import { findRequestPk, listRequests, type RequestFilters } from '../storage/request-queries.ts';
import { createRequestLookups, type ChargeParty, type RequestLookups } from '../storage/request-lookups.ts';
import { findRequestByRequestId, type RequestRow } from '../storage/requests.ts';

const count = z.number().int('must be an integer').min(0, 'must be >= 0').max(Number.MAX_SAFE_INTEGER).default(0);
const seconds = z.number().min(0, 'must be >= 0').max(1e12).default(0);

export const recordRequestBody = z
  .object({
    request_id: z.string().min(1).max(255),
    // Older body: the connection and the meter (product) named by their secrets.
    connection_secret: z.string().min(1).max(255).optional(),
    product_secret: z.string().min(1).max(255).optional(),
    // Newer body: the customer by id and the meter by slug.
    connection_id: customerRef.optional(),
    customer_id: customerRef.optional().describe('The customer id, or its reference_id'),
    meter_slug: z.string().min(1).max(100).optional(),
    provider: z.string().min(1).max(100).optional(),
    model: z.string().min(1).max(255).optional(),
    metadata: metadataSchema.optional(),
    input_tokens: count,
    output_tokens: count,
    input_characters: count,
    output_characters: count,
    input_seconds: seconds,
    output_seconds: seconds,
  })
  .superRefine((body, ctx) => {
    const older = body.connection_secret !== undefined || body.product_secret !== undefined;
    const newer = body.connection_id !== undefined || body.customer_id !== undefined || body.meter_slug !== undefined;
    if (older && newer) {
      ctx.addIssue({ code: 'custom', path: [], message: 'use either connection_secret/product_secret or customer_id/meter_slug, not both' });
    } else if (older) {
      if (!body.connection_secret) ctx.addIssue({ code: 'custom', path: ['connection_secret'], message: 'is required with product_secret' });
      if (!body.product_secret) ctx.addIssue({ code: 'custom', path: ['product_secret'], message: 'is required with connection_secret' });
    } else {
      if (!body.connection_id && !body.customer_id) ctx.addIssue({ code: 'custom', path: ['customer_id'], message: 'customer_id (or connection_id) is required' });
      if (body.connection_id && body.customer_id && body.connection_id !== body.customer_id) {
        ctx.addIssue({ code: 'custom', path: ['customer_id'], message: 'customer_id and connection_id name different customers' });
      }
      if (!body.meter_slug) ctx.addIssue({ code: 'custom', path: ['meter_slug'], message: 'is required' });
    }
    if ((body.provider === undefined) !== (body.model === undefined)) {
      ctx.addIssue({ code: 'custom', path: [body.provider ? 'model' : 'provider'], message: 'provider and model go together' });
    }
  });
export type RecordRequestBody = z.infer<typeof recordRequestBody>;

/** Key order and defaults must not make two equal bodies look different. */
function bodyHash(body: RecordRequestBody): string {
  const canonical = (v: unknown): unknown =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical((v as Record<string, unknown>)[k])]))
      : v;
  return createHash('sha256').update(JSON.stringify(canonical(body))).digest('hex');
}

function usageOf(body: RecordRequestBody): Usage {
  return {
    inputTokens: body.input_tokens,
    outputTokens: body.output_tokens,
    inputCharacters: body.input_characters,
    outputCharacters: body.output_characters,
    inputSeconds: toSeconds(body.input_seconds),
    outputSeconds: toSeconds(body.output_seconds),
  };
}

const breakdownItem = z.object({
  tier: z.object({ start: z.number(), rate: z.string(), type: z.string() }),
  tokens: z.number(),
  characters: z.number(),
  seconds: z.number(),
  cost: z.string(),
});

/** One record shape serves both vocabularies (a superset of the two variants). */
export const requestRecordSchema = z.object({
  request_id: z.string(),
  status: z.enum(['pending', 'completed', 'error']),
  provider: z.string(),
  endpoint: z.string(),
  provider_key_type: z.enum(['managed', 'unmanaged']),
  model: z.string().nullable().describe('The model the provider served, as its answer names it'),
  requested_model: z.string().nullable().describe('The model the request named, when the provider answered under another name (e.g. gpt-4o-mini served as gpt-4o-mini-2024-07-18); else null'),
  response_id: z.string().nullable(),
  connection_id: z.string().nullable(),
  customer_id: z.string().nullable(),
  product_id: z.string().nullable(),
  meter_id: z.string().nullable(),
  model_usage: z.object({
    input_tokens: z.number(),
    output_tokens: z.number(),
    total_tokens: z.number(),
    cached_input_tokens: z.number().describe('Part of input_tokens read from the provider prompt cache'),
    cache_write_input_tokens: z.number().describe('Part of input_tokens written to the provider prompt cache'),
    reasoning_tokens: z
      .number()
      .describe('Part of output_tokens the model spent reasoning (thinking), as the provider reports it: OpenAI reasoning_tokens, Gemini thoughtsTokenCount; 0 where it reports none (Anthropic counts thinking inside output_tokens only)'),
    output_images: z.number().describe('Images an image generation made'),
    price_unit: z
      .enum(['tokens', 'minutes', 'images', 'characters'])
      .nullable()
      .describe('The unit input_cost and output_cost were priced by: tokens, minutes of audio, images generated or characters spoken; null when no provider price was known'),
    input_characters: z.number(),
    output_characters: z.number(),
    total_characters: z.number(),
    input_seconds: z.number(),
    output_seconds: z.number(),
    total_seconds: z.number(),
    input_cost: z.string(),
    output_cost: z.string(),
    total_cost: z.string(),
    payer: z.enum(['wallet', 'merchant']),
  }),
  fee: z.object({
    amount: z.string(),
    rate_type: z.enum(['fixed', 'percentage']),
    token_basis: z.enum(['input+output', 'output']),
    breakdown: z.array(breakdownItem),
  }),
  service_charge: z.object({ amount: z.string(), payer: z.enum(['wallet', 'merchant']) }),
  total_request_cost: z.string(),
  total_wallet_cost: z.string(),
  total_merchant_cost: z.string(),
  cost: z.string().describe('Base usage cost (newer vocabulary)'),
  charge: z.object({ amount: z.string(), rate_type: z.enum(['fixed', 'percentage']), breakdown: z.array(breakdownItem) }),
  metadata: z.record(z.string(), z.string()),
  usage_estimated: z.boolean().describe('True when part of the usage was estimated (a stream cut mid-way)'),
  timestamp: z.string().nullable(),
  created_at: z.string(),
});
export type RequestRecord = z.infer<typeof requestRecordSchema>;

export function presentRequest(row: RequestRow): RequestRecord {
  const n = (v: bigint) => Number(v);
  const inputSeconds = secondsToMicros(row.input_seconds);
  const outputSeconds = secondsToMicros(row.output_seconds);
  const breakdown = JSON.parse(row.breakdown) as z.infer<typeof breakdownItem>[];
  const baseTotal = row.input_cost + row.output_cost;
  return {
    request_id: row.request_id,
    status: row.status,
    provider: row.provider,
    endpoint: row.endpoint,
    provider_key_type: row.provider_key_type,
    model: row.model,
    requested_model: row.requested_model,
    response_id: row.response_id,
    connection_id: row.connection_id,
    customer_id: row.connection_id,
    product_id: row.meter_id,
    meter_id: row.meter_id,
    model_usage: {
      input_tokens: n(row.input_tokens),
      output_tokens: n(row.output_tokens),
      total_tokens: n(row.input_tokens + row.output_tokens),
      cached_input_tokens: n(row.cached_input_tokens),
      cache_write_input_tokens: n(row.cache_write_input_tokens),
      reasoning_tokens: n(row.reasoning_tokens),
      output_images: n(row.output_images),
      price_unit: row.price_unit,
      input_characters: n(row.input_characters),
      output_characters: n(row.output_characters),
      total_characters: n(row.input_characters + row.output_characters),
      input_seconds: Number(row.input_seconds),
      output_seconds: Number(row.output_seconds),
      total_seconds: Number(formatMicros(inputSeconds + outputSeconds)),
      input_cost: formatMoney(row.input_cost),
      output_cost: formatMoney(row.output_cost),
      total_cost: formatMoney(baseTotal),
      payer: row.base_cost_payer,
    },
    fee: { amount: formatMoney(row.fee_amount), rate_type: row.rate_type, token_basis: row.token_basis, breakdown },
    service_charge: { amount: formatMoney(row.service_charge_amount), payer: row.service_charge_payer },
    total_request_cost: formatMoney(row.total_request_cost),
    total_wallet_cost: formatMoney(row.total_wallet_cost),
    total_merchant_cost: formatMoney(row.total_merchant_cost),
    cost: formatMoney(baseTotal),
    charge: { amount: formatMoney(row.fee_amount), rate_type: row.rate_type, breakdown },
    metadata: JSON.parse(row.metadata) as Record<string, string>,
    usage_estimated: Number(row.usage_estimated) === 1,
    timestamp: row.provider_timestamp ?? row.completed_at,
    created_at: row.created_at,
  };
}

const idFilter = z.string().min(1).max(100).optional();
const customerFilter = customerRef.optional().describe('A customer id, or its reference_id');

/** Filters GET /requests and GET /usage share; each id filter has a name in both vocabularies. */
export const requestFilterQuery = {
  connection_id: customerFilter,
  customer_id: customerFilter.describe('Same filter as connection_id (newer name); a customer id or its reference_id'),
  product_id: idFilter,
  meter_id: idFilter.describe('Same filter as product_id (newer name)'),
  metadata_filters: z
    .string()
    .optional()
    .describe('JSON array of [key, value] string pairs, all of which must match, e.g. [["team","a"]]'),
};
export type FilterQuery = { [K in keyof typeof requestFilterQuery]?: string | undefined };

/** The list and usage filters; a customer may be named by its reference_id. */
export async function requestFiltersOf(db: Storage['db'], merchantId: string, query: FilterQuery): Promise<RequestFilters> {
  const pairs = query.metadata_filters;
  const customer = oneFilter(query, 'connection_id', 'customer_id');
  return {
    connectionId: customer === undefined ? undefined : await resolveCustomerId(db, merchantId, customer),
    meterId: oneFilter(query, 'product_id', 'meter_id'),
    metadata: pairs === undefined ? [] : parseJsonParam(pairs, metadataFiltersSchema, ['metadata_filters']),
  };
}

/** Both names of one filter may be sent, but then they must name the same thing. */
function oneFilter(query: FilterQuery, older: keyof FilterQuery, newer: keyof FilterQuery): string | undefined {
  const [a, b] = [query[older], query[newer]];
  if (a !== undefined && b !== undefined && a !== b) {
    throw validationError([{ path: [newer], message: `${newer} and ${older} are the same filter and must not differ` }]);
  }
  return b ?? a;
}


/** Records POST /v1/requests bodies: one charge writer per app, drained when the app closes. */
export type RequestRecorder = {
  /**
   * Records a new request (201), or answers with the record already stored under its request_id
   * (200, or 409 when the bodies differ) — also when the new attempt would be refused, so a retry
   * of a recorded request never gets a 402 or a 404.
   */
  record(principal: Principal, body: RecordRequestBody): Promise<{ status: 200 | 201; row: RequestRecord }>;
  drain(): Promise<void>;
};

/** `unwritten`: the app's holds admitted in process and not written yet, which a charge must leave. */
export function requestRecorder(deps: AppDeps, unwritten: UnwrittenHolds, log?: Pick<FastifyBaseLogger, 'warn'>): RequestRecorder {
  const { storage, config } = deps;
  const lookups = createRequestLookups(storage);
  const writer = chargeWriter(storage, log);

  /** A stored record answers a repeated request_id: 200 when the body matches, 409 when it does not. */
  const replay = (row: RequestRow, hash: string) => {
    if (row.body_hash !== hash) {
      throw new ApiError('request_id_conflict', `request_id ${row.request_id} was already recorded with a different body.`);
    }
    return presentRequest(row);
  };

  async function record(principal: Principal, body: RecordRequestBody): Promise<{ status: 200 | 201; row: RequestRecord }> {
    const hash = bodyHash(body);
    const storedOr = async (error: unknown) => {
      const stored = await lookups.recordByRequestId.load({ merchantId: principal.merchantId, value: body.request_id });
      if (!stored) throw error;
      return { status: 200 as const, row: replay(stored, hash) };
    };
    // A remembered customer or meter found deleted by the charge is looked up once more.
    for (let attempt = 1; ; attempt++) {
      const parties = await resolveConnectionAndMeter(storage, lookups, principal.merchantId, body).catch((e: unknown) => new Unresolved(e));
      if (parties instanceof Unresolved) return storedOr(parties.error);
      const input = chargeInputOf(principal, body, hash, parties);
      const outcome = await admitWithAutoTopUp(
        deps,
        (refused) => ({ walletId: parties.connection.wallet_id, needed: refused.needed, drawsPlanCredit: refused.drawsPlanCredit, unwritten }),
        () => writer.run(CHARGE_JOB, input),
      );
      switch (outcome.outcome) {
        case 'recorded':
          return { status: 201, row: presentRequest(outcome.row) };
        case 'duplicate':
          // A concurrent request with the same request_id won the race; answer as its replay.
          return storedOr(new ApiError('internal_error'));
        case 'insufficient_balance':
          return storedOr(insufficientBalance(outcome));
        case 'amount_too_large':
          return storedOr(new ApiError('validation_error', 'The usage prices above the largest amount Tollgate records (100000000).'));
        case 'customer_deleted':
        case 'meter_deleted':
          forgetParties(lookups, principal.merchantId, body, parties);
          if (attempt === 2) return storedOr(new ApiError('not_found', 'The customer or meter of this request was deleted.'));
      }
    }
  }

  function chargeInputOf(principal: Principal, body: RecordRequestBody, hash: string, parties: Parties): ChargeInput {
    const basePrices =
      body.provider && body.model
        ? lookupBasePrices(body.provider, body.model, {
            overrides: config.priceOverrides,
            inputTokens: body.input_tokens,
            account: builtinProvider(body.provider)?.sharesAccountWith,
            ownPrices: builtinProvider(body.provider)?.ownPrices,
          })
        : null;
    return {
      merchant: { id: principal.merchantId, wallet_id: principal.merchantWalletId },
      connection: parties.connection,
      meter: parties.meter,
      requestId: body.request_id,
      bodyHash: hash,
      usage: usageOf(body),
      provider: body.provider ?? 'custom',
      model: body.model ?? null,
      endpoint: 'POST /v1/requests',
      providerKeyType: 'managed',
      basePrices,
      serviceChargeRate: principal.serviceChargeRate ?? config.serviceChargeRate,
      metadata: body.metadata ?? {},
      now: dateOf(deps.clock),
      unwritten,
    };
  }

  return { record, drain: () => writer.drain() };
}

export const listRequestsQuery = pageQuery.extend({
  // The cursor is a caller-chosen request_id, which may be as long as POST /requests allows.
  cursor: z.string().min(1).max(255).optional().describe('request_id of the last record of the previous page'),
  ...requestFilterQuery,
});

/** GET /requests: a list is a report, so it reads from the replica, if any. */
export async function listRequestRecords(storage: Storage, merchantId: string, query: z.infer<typeof listRequestsQuery>): Promise<Page<RequestRecord>> {
  const reports = reportsOf(storage);
  const filters = await requestFiltersOf(reports.db, merchantId, query);
  const beforePk = await cursorPosition(reports.db, merchantId, query.cursor);
  const rows = await listRequests(reports.db, merchantId, filters, { beforePk, limit: query.limit });
  return pageOfRecords(rows, query.limit);
}

/**
 * One record by its request_id, from the primary (not the replica). `unwritten` is a forwarded
 * request whose answer has started but whose record is not written yet, looked at before the
 * database: an entry goes only once its record is written, so one of the two has it.
 */
export async function findRequestRecord(storage: Storage, merchantId: string, requestId: string, unwritten?: RequestRow): Promise<RequestRecord> {
  const row = (await findRequestByRequestId(storage.db, merchantId, requestId)) ?? unwritten;
  if (!row) throw notFound('request', requestId);
  return presentRequest(row);
}

/** The client pages by request_id; the list runs on the internal id of the record it names. */
async function cursorPosition(db: Storage['db'], merchantId: string, cursor: string | undefined) {
  let pk: string | undefined;
  await assertCursor(cursor, async (requestId) => {
    pk = await findRequestPk(db, merchantId, requestId);
    return pk !== undefined;
  });
  return pk;
}

/** Like every list, but the cursor shown is the last record's request_id (ids stay internal). */
function pageOfRecords(rows: RequestRow[], limit: number): Page<RequestRecord> {
  const page = toPage(rows, limit, presentRequest);
  const last = page.data[page.data.length - 1];
  return { ...page, next_cursor: page.has_more && last ? last.request_id : null };
}

/**
 * Who is charged and on which meter. Whether the customer's plan credit pays it is the charge
 * batch's decision, under its locks (decision 0016).
 */
type Parties = { connection: ChargeParty; meter: MeterRow };

async function resolveConnectionAndMeter(storage: Storage, lookups: RequestLookups, merchantId: string, body: RecordRequestBody): Promise<Parties> {
  const within = (value: string) => ({ merchantId, value });
  if (body.connection_secret && body.product_secret) {
    const [connection, meter] = await Promise.all([
      lookups.customerBySecret.load(within(body.connection_secret)),
      lookups.meterBySecret.load(within(body.product_secret)),
    ]);
    if (!connection) throw new ApiError('not_found', 'No connection with that connection_secret.');
    if (!meter) throw new ApiError('not_found', 'No product (meter) with that product_secret.');
    return { connection, meter };
  }
  const customerId = (body.customer_id ?? body.connection_id)!;
  const [connection, meter] = await Promise.all([
    // A reference is looked up every time (it may move to another customer); an id is remembered.
    resolveCustomerId(storage.db, merchantId, customerId).then((id) => lookups.customerById.load(within(id))),
    lookups.meterBySlug.load(within(body.meter_slug!)),
  ]);
  if (!connection) throw notFound('customer', customerId);
  if (!meter) throw new ApiError('not_found', `No meter with meter_slug ${body.meter_slug}.`);
  return { connection, meter };
}

function forgetParties(lookups: RequestLookups, merchantId: string, body: RecordRequestBody, parties: Parties): void {
  const within = (value: string) => ({ merchantId, value });
  if (body.connection_secret) lookups.customerBySecret.forget(within(body.connection_secret));
  if (body.product_secret) lookups.meterBySecret.forget(within(body.product_secret));
  if (body.customer_id ?? body.connection_id) lookups.customerById.forget(within(parties.connection.id));
  if (body.meter_slug) lookups.meterBySlug.forget(within(body.meter_slug));
}

function insufficientBalance(refusal: BalanceShortfall): ApiError {
  const whose = refusal.payer === 'wallet' ? "The customer's wallet" : "The merchant's wallet";
  return new ApiError(
    'insufficient_balance',
    `${whose} cannot cover this request: needs ${formatMoney(refusal.needed)}, has ${formatMoney(refusal.available)} available.`,
  );
}

/** Why the body's customer or meter could not be found (a 404), kept until a stored record is ruled out. */
class Unresolved {
  constructor(readonly error: unknown) {}
}

/** The built-in provider a recorded request names: its account and own prices price the usage as a forward would. */
function builtinProvider(providerId: string): ProviderModule | undefined {
  return BUILTIN_PROVIDERS.find((provider) => provider.id === providerId);
}
