import type { Kysely, Transaction } from 'kysely';
import type { Storage } from './db.ts';
import type { CheckoutSessionsTable, Database } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type CheckoutSessionRow = CheckoutSessionsTable;
type Db = Kysely<Database> | Transaction<Database>;

export async function insertCheckoutSession(storage: Storage, row: CheckoutSessionRow): Promise<void> {
  await storage.db.insertInto('checkout_sessions').values(row).execute();
}

export async function findCheckoutSession(storage: Storage, merchantId: string, id: string): Promise<CheckoutSessionRow | undefined> {
  return storage.db.selectFrom('checkout_sessions').selectAll().where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
}

/** A session by its id alone (a receipt link names it; its key is checked by the caller). */
export async function findCheckoutSessionById(db: Db, id: string): Promise<CheckoutSessionRow | undefined> {
  return db.selectFrom('checkout_sessions').selectAll().where('id', '=', id).executeTakeFirst();
}

/** The session a checkout token opens (tokens are stored only as their SHA-256). */
export async function findCheckoutSessionByTokenHash(db: Db, tokenHash: string): Promise<CheckoutSessionRow | undefined> {
  return db.selectFrom('checkout_sessions').selectAll().where('token_hash', '=', tokenHash).executeTakeFirst();
}

export async function listCheckoutSessions(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<CheckoutSessionRow[]> {
  return storage.db
    .selectFrom('checkout_sessions')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}

/**
 * Marks a session completed, once: false when it already was, or has expired. The caller's
 * transaction then applies the session's effects, so they happen exactly when this succeeds.
 */
export async function completeCheckoutSession(
  trx: Transaction<Database>,
  id: string,
  changes: Pick<CheckoutSessionRow, 'completed_at' | 'connection_id' | 'subscription_id'>,
): Promise<boolean> {
  const result = await trx
    .updateTable('checkout_sessions')
    .set(changes)
    .where('id', '=', id)
    .where('completed_at', 'is', null)
    .where('expires_at', '>', changes.completed_at!)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

/** A new customer's contact as the page collected it (connection columns). */
export type CheckoutContact = { first_name: string | null; last_name: string | null; email: string | null; phone: string | null };

/**
 * Keeps the contact the page collected on a session that creates its customer, as it is paid: a
 * completion by the provider's webhook (another request, maybe another instance) reads it back.
 */
export async function keepCheckoutContact(db: Db, id: string, contact: CheckoutContact): Promise<void> {
  await db.updateTable('checkout_sessions').set({ contact: JSON.stringify(contact) }).where('id', '=', id).where('completed_at', 'is', null).execute();
}

/** The contact kept on a session (keepCheckoutContact), or none. */
export function keptContactOf(session: CheckoutSessionRow): CheckoutContact {
  const none = { first_name: null, last_name: null, email: null, phone: null };
  return session.contact ? { ...none, ...(JSON.parse(session.contact) as Partial<CheckoutContact>) } : none;
}

/**
 * How many of a session's payments the provider declined. A declined payment gives the session's
 * reference up by naming it before a colon (`cs_…:pay_…`); one that failed for a reason that is
 * not the card's fault (`notDeclines`: the provider did not answer, a hosted checkout closed
 * unpaid, never charged) does not count.
 */
export async function countCheckoutDeclines(db: Db, sessionId: string, notDeclines: readonly string[]): Promise<number> {
  const prefix = `${sessionId}:`;
  const rows = await db
    .selectFrom('payments')
    .select(['reference', 'failure_reason'])
    .where('purpose', '=', 'checkout')
    .where('reference', 'like', `${prefix}%`)
    .where('status', '=', 'failed')
    .execute();
  // LIKE reads `_` as any character (and SQLite ignores case): the exact prefix decides.
  return rows.filter((r) => r.reference.startsWith(prefix) && !notDeclines.includes(r.failure_reason ?? '')).length;
}
