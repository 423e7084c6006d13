/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * GET /requests filtered by metadata pages newest first by internal id: this index yields a
 * pair's records already in id order, so a page reads `limit + 1` index entries instead of
 * sorting every record that carries the pair.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createIndex('request_metadata_pair_order_idx')
    .on('request_metadata')
    .columns(['merchant_id', 'key', 'value', 'request_pk'])
    .execute();
}
