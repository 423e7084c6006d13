import { createHash } from 'node:crypto';
import { z } from 'zod';
import { admitWithAutoTopUp } from '../commerce/auto-top-up.ts';
import { formatMoney } from '../domain/money.ts';
import { lookupBasePrices } from '../domain/base-prices.ts';
import { toSeconds, type Usage } from '../domain/pricing.ts';
import { principalOf, type Principal } from '../http/auth.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { LAVA_METADATA_HEADER, mergeMetadata, METADATA_HEADER, metadataSchema, outsideMetadata, type MetadataHeaders } from '../http/metadata.ts';
import { assertCursor, pageQuery, pageResponse, toPage, type Page } from '../http/pagination.ts';
import { customerRef, errorResponse, idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { dateOf } from '../domain/clock.ts';
import type { ChargeInput, BalanceShortfall } from '../ledger/charge.ts';
import { CHARGE_JOB, chargeWriter } from '../ledger/charge-batch.ts';
import type { UnwrittenHolds } from '../ledger/wallets.ts';
import { BUILTIN_PROVIDERS } from '../providers/builtin.ts';
import type { ProviderModule } from '../providers/types.ts';
import type { MeterRow } from '../storage/meters.ts';
import { reportsOf, type Storage } from '../storage/db.ts';
import { findRequestPk, listRequests } from '../storage/request-queries.ts';
import { createRequestLookups, type ChargeParty, type RequestLookups } from '../storage/request-lookups.ts';
import type { PendingRecords } from '../gateway/pending-records.ts';
import { presentRequest, requestFilterQuery, requestFiltersOf, requestRecordSchema, type RequestRecord } from '../services/requests.ts';
import { resolveCustomerId } from '../storage/connections.ts';
import { findRequestByRequestId, type RequestRow } from '../storage/requests.ts';

const count = z.number().int('must be an integer').min(0, 'must be >= 0').max(Number.MAX_SAFE_INTEGER).default(0);
const seconds = z.number().min(0, 'must be >= 0').max(1e12).default(0);

const createBody = z
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
type CreateBody = z.infer<typeof createBody>;

const createQuery = z.object({
  metadata: z
    .string()
    .optional()
    .describe(`JSON object of metadata, merged with the body's (the body wins on a shared key; this wins over the ${METADATA_HEADER}, ${LAVA_METADATA_HEADER} and ${LAVA_METADATA_HEADER}-<key> headers)`),
});

/**
 * The request's metadata from all three places it may arrive, merged key by key: the body's own
 * wins over the query parameter and the header (see outsideMetadata). Without any from the query
 * or header the body stays as sent, so its replay hash is unchanged.
 */
function withOutsideMetadata(body: CreateBody, fromQuery: string | undefined, headers: MetadataHeaders): CreateBody {
  const outside = outsideMetadata(fromQuery, headers);
  if (Object.keys(outside).length === 0) return body;
  return Object.assign({}, body, { metadata: mergeMetadata(outside, body.metadata) });
}

/** Key order and defaults must not make two equal bodies look different. */
function bodyHash(body: CreateBody): string {
  const canonical = (v: unknown): unknown =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical((v as Record<string, unknown>)[k])]))
      : v;
  return createHash('sha256').update(JSON.stringify(canonical(body))).digest('hex');
}

function usageOf(body: CreateBody): Usage {
  return {
    inputTokens: body.input_tokens,
    outputTokens: body.output_tokens,
    inputCharacters: body.input_characters,
    outputCharacters: body.output_characters,
    inputSeconds: toSeconds(body.input_seconds),
    outputSeconds: toSeconds(body.output_seconds),
  };
}

const listQuery = pageQuery.extend({
  // The cursor is a caller-chosen request_id, which may be as long as POST /requests allows.
  cursor: z.string().min(1).max(255).optional().describe('request_id of the last record of the previous page'),
  ...requestFilterQuery,
});

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

const tags = ['requests'];

/** `unwritten`: the app's holds admitted in process and not written yet, which a charge must leave. */
export function registerRequestRoutes(app: App, deps: AppDeps, unwritten: UnwrittenHolds, pending?: Pick<PendingRecords, 'find'>): void {
  const { storage, config } = deps;
  const lookups = createRequestLookups(storage);
  const writer = chargeWriter(storage, app.log);
  app.addHook('onClose', () => writer.drain());

  /** A stored record answers a repeated request_id: 200 when the body matches, 409 when it does not. */
  const replay = (row: RequestRow, hash: string) => {
    if (row.body_hash !== hash) {
      throw new ApiError('request_id_conflict', `request_id ${row.request_id} was already recorded with a different body.`);
    }
    return presentRequest(row);
  };

  app.post(
    '/requests',
    {
      schema: {
        tags,
        body: createBody,
        querystring: createQuery,
        response: {
          200: requestRecordSchema,
          201: requestRecordSchema,
          ...standardErrors,
          402: errorResponse('`insufficient_balance`: the wallet (after an auto top-up, if it has one) cannot cover the charge; nothing was recorded'),
        },
      },
    },
    async (request, reply) => {
      const body = withOutsideMetadata(request.body, request.query.metadata, request.headers);
      const { status, row } = await recordRequest(principalOf(request), body);
      return reply.status(status).send(row);
    },
  );

  /**
   * Records a new request (201), or answers with the record already stored under its request_id
   * (200, or 409 when the bodies differ) — also when the new attempt would be refused, so a retry
   * of a recorded request never gets a 402 or a 404.
   */
  async function recordRequest(principal: Principal, body: CreateBody): Promise<{ status: 200 | 201; row: RequestRecord }> {
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

  function chargeInputOf(principal: Principal, body: CreateBody, hash: string, parties: Parties): ChargeInput {
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

  app.get(
    '/requests',
    { schema: { tags, querystring: listQuery, response: { 200: pageResponse(requestRecordSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      // A list is a report: read from the replica, if any (a single record, GET /requests/{id}, is not).
      const reports = reportsOf(storage);
      const filters = await requestFiltersOf(reports.db, merchantId, request.query);
      const beforePk = await cursorPosition(reports.db, merchantId, cursor);
      const rows = await listRequests(reports.db, merchantId, filters, { beforePk, limit });
      return pageOfRecords(rows, limit);
    },
  );

  app.get(
    '/requests/:id',
    {
      schema: {
        tags,
        description:
          'A forwarded request is found as soon as its answer has started (its id is in the response headers): `status: pending` while it is relayed and settled, with its customer, meter, provider, model, endpoint, metadata and created_at, usage and costs all zero; `completed` (or `error`) once settled, usually within some 50 ms of the answer ending.',
        params: idParams,
        response: { 200: requestRecordSchema, ...standardErrors },
      },
    },
    async (request) => {
      const { merchantId } = principalOf(request);
      // Looked at before the database: an entry goes only once its record is written, so one of the
      // two has a request whose response has started.
      const unwrittenRecord = pending?.find(merchantId, request.params.id);
      const row = (await findRequestByRequestId(storage.db, merchantId, request.params.id)) ?? unwrittenRecord;
      if (!row) throw notFound('request', request.params.id);
      return presentRequest(row);
    },
  );
}

/**
 * Who is charged and on which meter. Whether the customer's plan credit pays it is the charge
 * batch's decision, under its locks (decision 0016).
 */
type Parties = { connection: ChargeParty; meter: MeterRow };

async function resolveConnectionAndMeter(storage: AppDeps['storage'], lookups: RequestLookups, merchantId: string, body: CreateBody): Promise<Parties> {
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

function forgetParties(lookups: RequestLookups, merchantId: string, body: CreateBody, parties: Parties): void {
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

/** The built-in provider whose account a provider is another API of (google-openai → google), if any. */
/** The built-in provider a recorded request names: its account and own prices price the usage as a forward would. */
function builtinProvider(providerId: string): ProviderModule | undefined {
  return BUILTIN_PROVIDERS.find((provider) => provider.id === providerId);
}
