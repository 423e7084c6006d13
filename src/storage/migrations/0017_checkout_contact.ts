/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Decision 0016: the contact details the checkout page collected for the customer a session will
 * create (JSON: first_name, last_name, email, phone), kept when the session is paid, so that a
 * session completed by the payment provider's webhook creates the same customer as the page.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('checkout_sessions').addColumn('contact', 'text').execute();
}
