/**
 * Customers (still "connections" in the tables and the older API vocabulary): create, change,
 * delete and credit them, and show them as the API does. Their events are written here, in the
 * transaction of the change. The API, the dashboard and the hosted checkout share presentCustomer.
 */
import { z } from 'zod';
import type { AppDeps } from '../app-deps.ts';
import { cancelDeletedCustomersSubscription } from '../commerce/renewals.ts';
import { dateOf } from '../domain/clock.ts';
import { isValidEmail } from '../domain/email.ts';
import { ID_PREFIX } from '../domain/ids.ts';
import { formatMoney, parseMoney } from '../domain/money.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { metadataSchema } from '../http/metadata.ts';
import { assertCursor, pageQuery, toPage, type Page } from '../http/pagination.ts';
import { optionalBody, positiveDecimal } from '../http/schemas.ts';
import { grantCredit, WalletBalanceLimitError } from '../ledger/wallets.ts';
import {
  findConnection,
  insertConnectionIn,
  isCustomerId,
  listConnections,
  softDeleteConnection,
  updateConnection,
  type ConnectionFields,
  type ConnectionWithBalance,
} from '../storage/connections.ts';
import type { Storage } from '../storage/db.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { merchantHasRow } from '../storage/pages.ts';
import { liveSubscriptionSummaries, type SubscriptionSummary } from '../storage/subscriptions.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';

/** The customer as the API shows it, with its subscription read now. */
export async function presentWithSubscription(storage: Storage, row: ConnectionWithBalance, now: Date): Promise<Customer> {
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
export const customerCreateBody = optionalBody(z.object(customerFields));
export const customerUpdateBody = optionalBody(z.object(customerFields));

export const customerCreditBody = z.object({
  amount: positiveDecimal.describe(
    'At most 100000000 per grant; a grant that would take the wallet balance above 100000000 (its maximum) is refused with wallet_balance_limit (422)',
  ),
  description: z.string().trim().min(1).max(255).optional(),
});
export const customerCreditSchema = z.object({
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
export const customerSchema = z.object({
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

export const customerListQuery = pageQuery.extend({ reference_id: z.string().min(1).max(255).optional() });

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
function toFields(body: z.infer<typeof customerUpdateBody>): Partial<ConnectionFields> {
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

type Deps = Pick<AppDeps, 'storage' | 'clock'>;

/**
 * POST /customers. Idempotent on reference_id: a customer that already has it is returned
 * unchanged (`created: false`), also when a concurrent create took the reference first. The
 * customer, its wallet and its `customer.created` event commit together.
 */
export async function createCustomer(deps: Deps, merchantId: string, body: z.infer<typeof customerCreateBody>): Promise<{ customer: Customer; created: boolean }> {
  const { storage } = deps;
  const now = dateOf(deps.clock);
  const reference = body.reference_id;
  const holder = () => (reference ? findConnection(storage, merchantId, reference) : Promise.resolve(undefined));
  const existing = await holder();
  if (existing) return { customer: await presentWithSubscription(storage, existing, now), created: false };
  const fields: ConnectionFields = { reference_id: null, first_name: null, last_name: null, email: null, phone: null, metadata: null, ...toFields(body) };
  const at = now.toISOString();
  try {
    const row = await storage.db.transaction().execute(async (trx) => {
      const created = await insertConnectionIn(trx, merchantId, fields, at);
      await enqueueEvent(trx, { merchantId, type: 'customer.created', data: presentCustomer(created, now), at });
      return created;
    });
    return { customer: presentCustomer(row, now), created: true };
  } catch (e) {
    if (!isUniqueViolation(e)) throw e;
    // A concurrent create took the reference first: that one is the customer.
    const winner = await holder();
    if (!winner) throw referenceTaken();
    return { customer: await presentWithSubscription(storage, winner, now), created: false };
  }
}

/** The live customer an id or reference_id names, or a 404 naming it in the caller's vocabulary. */
export async function getCustomer(storage: Storage, merchantId: string, idOrReference: string, noun: 'customer' | 'connection' = 'customer'): Promise<ConnectionWithBalance> {
  const row = await findConnection(storage, merchantId, idOrReference);
  if (!row) throw notFound(noun, idOrReference);
  return row;
}

export async function listCustomerPage(deps: Deps, merchantId: string, query: { cursor?: string | undefined; limit: number; reference_id?: string | undefined }): Promise<Page<Customer>> {
  const { storage } = deps;
  const { cursor, limit, reference_id } = query;
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'connections', merchantId, id));
  const rows = await listConnections(storage, merchantId, { cursor, limit, referenceId: reference_id });
  const now = dateOf(deps.clock);
  const summaries = await liveSubscriptionSummaries(storage.db, rows.map((row) => row.id));
  return toPage(rows, limit, (row) => presentCustomer(row, now, summaries.get(row.id) ?? null));
}

export async function changeCustomer(deps: Deps, merchantId: string, idOrReference: string, body: z.infer<typeof customerUpdateBody>): Promise<Customer> {
  const row = await updateConnection(deps.storage, merchantId, idOrReference, toFields(body));
  if (row === 'reference_taken') throw referenceTaken();
  if (!row) throw notFound('customer', idOrReference);
  return presentWithSubscription(deps.storage, row, dateOf(deps.clock));
}

/**
 * Deletes a customer (its details erased, its records kept), ends its subscription and writes
 * `customer.deleted`, all in one transaction. False when no live customer has the id or reference.
 */
export async function deleteCustomer(deps: Pick<AppDeps, 'storage' | 'clock' | 'payments'>, merchantId: string, idOrReference: string): Promise<boolean> {
  const now = dateOf(deps.clock);
  const at = now.toISOString();
  return deps.storage.db.transaction().execute(async (trx) => {
    const deleted = await softDeleteConnection(trx, merchantId, idOrReference, at);
    if (!deleted) return false;
    const data = presentCustomer(deleted.row, now, deleted.subscription);
    await enqueueEvent(trx, { merchantId, type: 'customer.deleted', data, at });
    // Nothing renews or charges a customer that no longer exists.
    await cancelDeletedCustomersSubscription(deps, trx, deleted.row.id, at);
    return true;
  });
}

/** A grant of credit to the customer's wallet (422 wallet_balance_limit past the maximum balance). */
export async function grantCustomerCredit(deps: Deps, merchantId: string, idOrReference: string, body: z.infer<typeof customerCreditBody>): Promise<z.infer<typeof customerCreditSchema>> {
  const customer = await getCustomer(deps.storage, merchantId, idOrReference);
  const amount = parseMoney(body.amount);
  const description = body.description ?? null;
  const at = new Date(deps.clock.now()).toISOString();
  const grant = await grantCredit(deps.storage, { merchantId, walletId: customer.wallet_id, amount, description, at }).catch((e: unknown) => {
    if (e instanceof WalletBalanceLimitError) throw new ApiError('wallet_balance_limit');
    throw e;
  });
  return {
    credit_id: grant.transactionId,
    customer_id: customer.id,
    wallet_id: customer.wallet_id,
    amount: formatMoney(amount),
    description,
    balance: formatMoney(grant.balance),
    created_at: grant.at,
  };
}
