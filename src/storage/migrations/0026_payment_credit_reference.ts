/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * A plan period's payment names the cycle credit it paid for (the `plan_credit` ledger
 * transaction's reference), so a refund of it can take that credit back (decision 0044).
 * Payments of top-ups and bundles find their credit by their own id and leave it null.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('payments').addColumn('credit_reference', 'text').execute();
}
