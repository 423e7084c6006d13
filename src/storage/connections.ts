import { ID_PREFIX, newId, newSecret } from '../domain/ids.ts';
import { insertWallet } from './wallets.ts';
import type { Storage } from './db.ts';
import { isUniqueViolation } from './errors.ts';
import type { Kysely, Transaction } from 'kysely';
import type { ConnectionsTable, Database } from './schema.ts';
import { liveSubscriptionSummaries, type SubscriptionSummary } from './subscriptions.ts';
import { newestFirstPage } from './pages.ts';

export type ConnectionRow = ConnectionsTable;
export type ConnectionWithBalance = ConnectionRow & { balance: bigint };

/**
 * Builds the `data` of a customer event from the row the change left (the customer as the API shows
 * it). The shape belongs to the service layer; commerce, which creates customers at checkout, is
 * given it.
 */
export type CustomerEventData = (row: ConnectionWithBalance, subscription?: SubscriptionSummary | null) => Record<string, unknown>;

export type ConnectionFields = Pick<
  ConnectionRow,
  'reference_id' | 'first_name' | 'last_name' | 'email' | 'phone' | 'metadata'
>;

/**
 * A connection (customer) and its own wallet, created together in the caller's transaction (which
 * also writes its `customer.created` event). A reference_id another customer has makes the insert
 * fail with a unique violation.
 */
export async function insertConnectionIn(
  trx: Transaction<Database>,
  merchantId: string,
  fields: ConnectionFields,
  createdAt: string,
): Promise<ConnectionWithBalance> {
  const wallet = await insertWallet(trx, { merchantId, ownerType: 'connection', createdAt });
  const row: ConnectionRow = {
    id: newId('connection'),
    merchant_id: merchantId,
    wallet_id: wallet.id,
    secret: newSecret('connection'),
    ...fields,
    created_at: createdAt,
    deleted_at: null,
  };
  await trx.insertInto('connections').values(row).execute();
  return { ...row, balance: wallet.balance };
}

/**
 * A customer is named by its id or by the merchant's own `reference_id`, wherever a customer id
 * goes. A reference may not start with the id prefix (`con_`), so a value names one or the other.
 */
export const isCustomerId = (value: string): boolean => value.startsWith(ID_PREFIX.connection);

const namingColumn = (idOrReference: string) => (isCustomerId(idOrReference) ? 'connections.id' : 'connections.reference_id') as 'connections.id';

/** The id of the live customer a value names (its id or its reference_id), if any. */
export async function findCustomerId(db: Kysely<Database>, merchantId: string, idOrReference: string): Promise<string | undefined> {
  const row = await db
    .selectFrom('connections')
    .select('id')
    .where('merchant_id', '=', merchantId)
    .where('deleted_at', 'is', null)
    .where(namingColumn(idOrReference), '=', idOrReference)
    .executeTakeFirst();
  return row?.id;
}

/**
 * For filters and lookups keyed by id: a reference becomes the id of the customer it names; an id,
 * or a reference nobody has, stays as given (it then matches nothing, as an unknown id does).
 */
export async function resolveCustomerId(db: Kysely<Database>, merchantId: string, idOrReference: string): Promise<string> {
  if (isCustomerId(idOrReference)) return idOrReference;
  return (await findCustomerId(db, merchantId, idOrReference)) ?? idOrReference;
}

function selectWithBalance(storage: Storage, merchantId: string) {
  return storage.db
    .selectFrom('connections')
    .innerJoin('wallets', 'wallets.id', 'connections.wallet_id')
    .selectAll('connections')
    .select('wallets.balance')
    .where('connections.merchant_id', '=', merchantId)
    .where('connections.deleted_at', 'is', null);
}

/** The live customer a value names: its id or its reference_id. */
export async function findConnection(
  storage: Storage,
  merchantId: string,
  id: string,
): Promise<ConnectionWithBalance | undefined> {
  const row = await selectWithBalance(storage, merchantId).where(namingColumn(id), '=', id).executeTakeFirst();
  return row && { ...row, balance: BigInt(row.balance) };
}

export async function listConnections(
  storage: Storage,
  merchantId: string,
  opts: { cursor?: string; limit: number; referenceId?: string },
): Promise<ConnectionWithBalance[]> {
  const rows = await selectWithBalance(storage, merchantId)
    .$if(opts.referenceId !== undefined, (q) => q.where('connections.reference_id', '=', opts.referenceId!))
    .$call((q) => newestFirstPage(q, opts, 'connections.id'))
    .execute();
  return rows.map((r) => ({ ...r, balance: BigInt(r.balance) }));
}

export async function updateConnection(
  storage: Storage,
  merchantId: string,
  id: string,
  changes: Partial<ConnectionFields>,
): Promise<ConnectionWithBalance | undefined | 'reference_taken'> {
  const customerId = await findCustomerId(storage.db, merchantId, id);
  if (customerId === undefined) return undefined;
  if (Object.keys(changes).length > 0) {
    try {
      await storage.db
        .updateTable('connections')
        .set(changes)
        .where('merchant_id', '=', merchantId)
        .where('id', '=', customerId)
        .where('deleted_at', 'is', null)
        .execute();
    } catch (e) {
      if (isUniqueViolation(e)) return 'reference_taken';
      throw e;
    }
  }
  return findConnection(storage, merchantId, customerId);
}

/**
 * Deletes a customer: its id, wallet and records stay (the ledger and usage still name it), but
 * its contact details and metadata are erased, since nobody can read them any more. Inside the
 * caller's transaction, which also ends the customer's subscription and writes `customer.deleted`.
 * Returns the customer as the deletion left it (ids, reference, wallet) and the subscription it
 * had, or null when no live customer has the id or reference.
 */
export async function softDeleteConnection(
  trx: Transaction<Database>,
  merchantId: string,
  idOrReference: string,
  deletedAt: string,
): Promise<{ row: ConnectionWithBalance; subscription: SubscriptionSummary | null } | null> {
  const id = await findCustomerId(trx, merchantId, idOrReference);
  if (id === undefined) return null;
  const erased = { first_name: null, last_name: null, email: null, phone: null, metadata: null };
  const result = await trx
    .updateTable('connections')
    .set({ deleted_at: deletedAt, ...erased })
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
  if (Number(result.numUpdatedRows) !== 1) return null;
  const row = await trx
    .selectFrom('connections')
    .innerJoin('wallets', 'wallets.id', 'connections.wallet_id')
    .selectAll('connections')
    .select('wallets.balance')
    .where('connections.id', '=', id)
    .executeTakeFirstOrThrow();
  // The subscription it had, as customer objects showed it (the caller then cancels it, decision 0016).
  const subscription = (await liveSubscriptionSummaries(trx, [id])).get(id) ?? null;
  return { row: { ...row, balance: BigInt(row.balance) }, subscription };
}

/** The older request body and forward token name a connection by its secret. */
export async function findConnectionBySecret(
  storage: Storage,
  merchantId: string,
  secret: string,
): Promise<ConnectionWithBalance | undefined> {
  const row = await selectWithBalance(storage, merchantId).where('connections.secret', '=', secret).executeTakeFirst();
  return row && { ...row, balance: BigInt(row.balance) };
}
