import { sql } from 'kysely';
import { encodeTime } from 'ulid';
import { ID_PREFIX } from '../domain/ids.ts';
import type { Storage } from './db.ts';

/** Events (with their deliveries) deleted per statement pair: each transaction stays short. */
export const PRUNE_BATCH = 500;

/**
 * Deletes, in one short transaction, up to PRUNE_BATCH events created before `before` whose every
 * delivery is final (succeeded, or failed after its last attempt) and was last tried before
 * `before`, together with those deliveries. An event not yet fanned out, or with a delivery still
 * pending (a redelivery included), is never touched. `full`: the batch was full, more may be due.
 */
export async function pruneDeliveredEvents(storage: Storage, before: string): Promise<{ deleted: number; full: boolean }> {
  // Event ids begin with their creation time: the bound lets the primary key skip the recent ones.
  const idBound = ID_PREFIX.event + encodeTime(Math.max(0, Date.parse(before)), 10);
  return storage.db.transaction().execute(async (trx) => {
    const events = await trx
      .selectFrom('events')
      .select('id')
      .where('id', '<', idBound)
      .where('created_at', '<', before)
      .where('dispatched_at', 'is not', null)
      .where(({ not, exists, selectFrom }) =>
        not(
          exists(
            selectFrom('webhook_deliveries as d')
              .select(sql.lit(1).as('one'))
              .whereRef('d.event_id', '=', 'events.id')
              .where((eb) => eb.or([eb('d.state', '=', 'pending'), eb('d.last_attempt_at', 'is', null), eb('d.last_attempt_at', '>=', before)])),
          ),
        ),
      )
      .orderBy('id')
      .limit(PRUNE_BATCH)
      .$call((q) => (storage.dialect === 'postgres' ? q.forUpdate().skipLocked() : q))
      .execute();
    if (events.length === 0) return { deleted: 0, full: false };
    const ids = events.map((e) => e.id);
    // A redelivery asked for meanwhile made its delivery pending again: it and its event stay.
    await trx.deleteFrom('webhook_deliveries').where('event_id', 'in', ids).where('state', '<>', 'pending').execute();
    const deleted = await trx
      .deleteFrom('events')
      .where('id', 'in', ids)
      .where(({ not, exists, selectFrom }) => not(exists(selectFrom('webhook_deliveries as d').select(sql.lit(1).as('one')).whereRef('d.event_id', '=', 'events.id'))))
      .executeTakeFirst();
    return { deleted: Number(deleted.numDeletedRows), full: events.length === PRUNE_BATCH };
  });
}
