import { z } from 'zod';
import { dateOf } from '../domain/clock.ts';
import { isValidEmail } from '../domain/email.ts';
import { ID_PREFIX } from '../domain/ids.ts';
import { formatMoney, parseMoney } from '../domain/money.ts';
import { grantCredit, WalletBalanceLimitError } from '../ledger/wallets.ts';
import { principalOf } from '../http/auth.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { metadataSchema } from '../http/metadata.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { customerParams, errorResponse, optionalBody, positiveDecimal, standardErrors, successResponse } from '../http/schemas.ts';
import { nowIsoOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { cancelDeletedCustomersSubscription } from '../commerce/renewals.ts';
import {
  findConnection,
  insertConnection,
  isCustomerId,
  listConnections,
  softDeleteConnection,
  updateConnection,
  type ConnectionFields,
  type ConnectionWithBalance,
} from '../storage/connections.ts';
import { liveSubscriptionSummaries, type SubscriptionSummary } from '../storage/subscriptions.ts';
import { merchantHasRow } from '../storage/pages.ts';

/** The customer as the API shows it, with its subscription read now. */
async function presentWithSubscription(storage: AppDeps['storage'], row: ConnectionWithBalance, now: Date): Promise<Customer> {
  const summaries = await liveSubscriptionSummaries(storage.db, [row.id]);
  return presentCustomer(row, now, summaries.get(row.id) ?? null);
}

const text = (max: number) => z.string().trim().min(1).max(max);

const customerFields = {
  reference_id: text(255)
    .refine((v) => !isCustomerId(v), `must not start with ${ID_PREFIX.connection} (a customer id does; a reference names a customer wherever an id does)`)
    .nullable()
    .optional(),
  name: text(255).nullable().optional(),
  first_name: text(255).nullable().optional(),
  last_name: text(255).nullable().optional(),
  email: z.string().trim().refine(isValidEmail, 'must be a valid email address').nullable().optional(),
  phone: text(32).nullable().optional(),
  metadata: metadataSchema.nullable().optional(),
};
// Fastify validates an absent body (a JSON content type with no bytes, as the published client
// sends it) as `null`, so a `.default({})` never applies; treat null/undefined as `{}`.
const createBody = optionalBody(z.object(customerFields));
const updateBody = optionalBody(z.object(customerFields));

const creditBody = z.object({
  amount: positiveDecimal.describe(
    'At most 100000000 per grant; a grant that would take the wallet balance above 100000000 (its maximum) is refused with wallet_balance_limit (422)',
  ),
  description: z.string().trim().min(1).max(255).optional(),
});
const creditSchema = z.object({
  credit_id: z.string(),
  customer_id: z.string(),
  wallet_id: z.string(),
  amount: z.string(),
  description: z.string().nullable(),
  balance: z.string().describe("The customer's wallet balance after the grant"),
  created_at: z.string(),
});

const contactSchema = z.object({
  phone: z.string().nullable(),
  email: z.string().nullable(),
  first_name: z.string().nullable(),
  last_name: z.string().nullable(),
});

/** One object serves both vocabularies: a customer (newer) is a connection (older). */
const customerSchema = z.object({
  customer_id: z.string(),
  connection_id: z.string().describe('Older name of customer_id'),
  connection_secret: z.string().describe('Secret the older forward token and request body use'),
  reference_id: z.string().nullable(),
  contact: contactSchema,
  wallet: contactSchema.extend({ wallet_id: z.string(), balance: z.string() }),
  subscription: z
    .object({ subscription_id: z.string(), plan_id: z.string(), name: z.string().describe("The plan's name"), status: z.enum(['active', 'past_due']).describe("`past_due` is Tollgate's extension: a renewal payment failed and is being retried") })
    .nullable()
    .describe('The subscription that is not cancelled (as GET /customers/{id}/subscription shows it in full), or null'),
  metadata: z.record(z.string(), z.string()).nullable(),
  next_usage_reset: z.string(),
  previous_usage_reset: z.string(),
  created_at: z.string(),
});
export type Customer = z.infer<typeof customerSchema>;

const customerListQuery = pageQuery.extend({ reference_id: z.string().min(1).max(255).optional() });

/** `subscription`: the customer's subscription that is not cancelled (liveSubscriptionSummaries), if any. */
export function presentCustomer(row: ConnectionWithBalance, now: Date, subscription: SubscriptionSummary | null = null): Customer {
  const contact = { phone: row.phone, email: row.email, first_name: row.first_name, last_name: row.last_name };
  const periodStart = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1);
  const nextPeriod = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1);
  return {
    customer_id: row.id,
    connection_id: row.id,
    connection_secret: row.secret,
    reference_id: row.reference_id,
    contact,
    wallet: { wallet_id: row.wallet_id, balance: formatMoney(row.balance), ...contact },
    subscription,
    metadata: row.metadata === null ? null : (JSON.parse(row.metadata) as Record<string, string>),
    next_usage_reset: new Date(nextPeriod).toISOString(),
    previous_usage_reset: new Date(periodStart).toISOString(),
    created_at: row.created_at,
  };
}

/** `name` is a convenience: "Ada Lovelace" fills first_name "Ada" and last_name "Lovelace". */
function toFields(body: z.infer<typeof updateBody>): Partial<ConnectionFields> {
  const fields: Partial<ConnectionFields> = {};
  if (body.name !== undefined) {
    const [first, ...rest] = (body.name ?? '').split(/\s+/).filter(Boolean);
    fields.first_name = first ?? null;
    fields.last_name = rest.length > 0 ? rest.join(' ') : null;
  }
  if (body.first_name !== undefined) fields.first_name = body.first_name;
  if (body.last_name !== undefined) fields.last_name = body.last_name;
  if (body.reference_id !== undefined) fields.reference_id = body.reference_id;
  if (body.email !== undefined) fields.email = body.email;
  if (body.phone !== undefined) fields.phone = body.phone;
  if (body.metadata !== undefined) fields.metadata = body.metadata === null ? null : JSON.stringify(body.metadata);
  return fields;
}

const referenceTaken = () => new ApiError('reference_id_taken');
const tags = ['customers'];

export function registerCustomerRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;

  app.post(
    '/customers',
    {
      schema: {
        tags,
        description:
          'Creates a customer (201). Idempotent on `reference_id`: when a customer already has it, that customer is returned unchanged (200) and the other fields are ignored.',
        body: createBody,
        response: { 201: customerSchema.describe('Created'), 200: customerSchema.describe('The customer that already has this reference_id'), ...standardErrors },
      },
    },
    async (request, reply) => {
      const { merchantId } = principalOf(request);
      const reference = request.body.reference_id;
      const holder = () => (reference ? findConnection(storage, merchantId, reference) : Promise.resolve(undefined));
      const existing = await holder();
      if (existing) return reply.status(200).send(await presentWithSubscription(storage, existing, dateOf(deps.clock)));
      const fields: ConnectionFields = {
        reference_id: null,
        first_name: null,
        last_name: null,
        email: null,
        phone: null,
        metadata: null,
        ...toFields(request.body),
      };
      const row = await insertConnection(storage, merchantId, fields, (row) => presentCustomer(row, dateOf(deps.clock)), nowIsoOf(deps));
      if (row === 'reference_taken') {
        // A concurrent create took the reference first: that one is the customer.
        const winner = await holder();
        if (!winner) throw referenceTaken();
        return reply.status(200).send(await presentWithSubscription(storage, winner, dateOf(deps.clock)));
      }
      return reply.status(201).send(presentCustomer(row, dateOf(deps.clock)));
    },
  );

  registerCustomerReadRoutes(app, deps, '/customers', tags);

  app.post(
    '/customers/:id/credits',
    {
      schema: {
        tags,
        params: customerParams,
        body: creditBody,
        response: {
          201: creditSchema,
          ...standardErrors,
          422: errorResponse('`wallet_balance_limit`: the grant would take the wallet balance above 100000000, its maximum; nothing was credited'),
        },
      },
    },
    async (request, reply) => {
      const { merchantId } = principalOf(request);
      const customer = await findConnection(storage, merchantId, request.params.id);
      if (!customer) throw notFound('customer', request.params.id);
      const amount = parseMoney(request.body.amount);
      const description = request.body.description ?? null;
      const grant = await grantCredit(storage, { merchantId, walletId: customer.wallet_id, amount, description, at: nowIsoOf(deps) }).catch((e: unknown) => {
        if (e instanceof WalletBalanceLimitError) throw new ApiError('wallet_balance_limit');
        throw e;
      });
      return reply.status(201).send({
        credit_id: grant.transactionId,
        customer_id: customer.id,
        wallet_id: customer.wallet_id,
        amount: formatMoney(amount),
        description,
        balance: formatMoney(grant.balance),
        created_at: grant.at,
      });
    },
  );

  app.patch(
    '/customers/:id',
    {
      schema: {
        tags,
        params: customerParams,
        body: updateBody,
        response: { 200: customerSchema, ...standardErrors, 409: errorResponse('`reference_id_taken`: another customer of this merchant already uses this reference_id') },
      },
    },
    async (request) => {
      const row = await updateConnection(storage, principalOf(request).merchantId, request.params.id, toFields(request.body));
      if (row === 'reference_taken') throw referenceTaken();
      if (!row) throw notFound('customer', request.params.id);
      return presentWithSubscription(storage, row, dateOf(deps.clock));
    },
  );
}

/** List, retrieve and delete: the same handlers serve /customers and the older /connections. */
export function registerCustomerReadRoutes(app: App, deps: AppDeps, base: string, tags: string[]): void {
  const { storage } = deps;
  const noun = base === '/customers' ? 'customer' : 'connection';

  app.get(
    base,
    { schema: { tags, querystring: customerListQuery, response: { 200: pageResponse(customerSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit, reference_id } = request.query;
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'connections', merchantId, id));
      const rows = await listConnections(storage, merchantId, { cursor, limit, referenceId: reference_id });
      const now = dateOf(deps.clock);
      const summaries = await liveSubscriptionSummaries(storage.db, rows.map((row) => row.id));
      return toPage(rows, limit, (row) => presentCustomer(row, now, summaries.get(row.id) ?? null));
    },
  );

  app.get(
    `${base}/:id`,
    { schema: { tags, params: customerParams, response: { 200: customerSchema, ...standardErrors } } },
    async (request) => {
      const row = await findConnection(storage, principalOf(request).merchantId, request.params.id);
      if (!row) throw notFound(noun, request.params.id);
      return presentWithSubscription(storage, row, dateOf(deps.clock));
    },
  );

  app.delete(
    `${base}/:id`,
    { schema: { tags, params: customerParams, response: { 200: successResponse, ...standardErrors } } },
    async (request) => {
      const { id } = request.params;
      const at = nowIsoOf(deps);
      const deleted = await storage.db.transaction().execute(async (trx) => {
        const found = await softDeleteConnection(trx, principalOf(request).merchantId, id, at, (row, subscription) =>
          presentCustomer(row, dateOf(deps.clock), subscription ?? null),
        );
        // Nothing renews or charges a customer that no longer exists.
        if (found) await cancelDeletedCustomersSubscription(deps, trx, found, at);
        return found;
      });
      if (!deleted) throw notFound(noun, id);
      return { success: true as const };
    },
  );
}
