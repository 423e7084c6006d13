import type { Kysely } from 'kysely';
import { encodeTime } from 'ulid';
import { ID_PREFIX, newId } from '../domain/ids.ts';
import type { Storage } from './db.ts';
import type { Database, WebhookDeliveriesTable } from './schema.ts';

/**
 * The dispatcher's queries. Several processes may run them against one PostgreSQL database at
 * once: every read that hands out work locks its rows with FOR UPDATE SKIP LOCKED, so each event
 * is fanned out once and each due delivery is claimed by one process. SQLite has one process.
 */

const FAN_OUT_BATCH = 500;
const INSERT_CHUNK = 200;

/** Ids are ULIDs whose first characters are their time; instances' clocks may differ by this much. */
const CLOCK_MARGIN_MS = 60_000;

/**
 * The events still to fan out, as where-conditions: those of merchants that have a webhook, from
 * their first webhook's creation on. Other events are never marked, so a deployment without
 * webhooks pays no write per event, and a merchant's first webhook does not make the dispatcher
 * walk through its whole history (those events stay unmarked, below its bound).
 */
async function undispatchedScope(db: Kysely<Database>): Promise<{ merchantId: string; fromId: string }[]> {
  const rows = await db.selectFrom('webhooks').select(['merchant_id', (eb) => eb.fn.min('created_at').as('since')]).groupBy('merchant_id').execute();
  return rows.map((r) => ({
    merchantId: r.merchant_id,
    fromId: ID_PREFIX.event + encodeTime(Math.max(0, Date.parse(String(r.since)) - CLOCK_MARGIN_MS), 10),
  }));
}

function undispatchedEvents(db: Kysely<Database>, scope: { merchantId: string; fromId: string }[]) {
  return db
    .selectFrom('events')
    .where('dispatched_at', 'is', null)
    .where((eb) => eb.or(scope.map((s) => eb.and([eb('merchant_id', '=', s.merchantId), eb('id', '>=', s.fromId)]))));
}

/**
 * Makes the deliveries of events not yet fanned out: one per event and enabled webhook of its
 * merchant that asked for its type and existed when the event happened. Marks the events done in
 * the same transaction. Returns how many events it took (a full batch means more may wait).
 * `deliveredName` is the event vocabulary's rule (webhooks/events.ts): the name an event goes out
 * under to a webhook subscribed to `chosen`, or null when it did not ask for it.
 */
export async function fanOutEvents(
  storage: Storage,
  at: string,
  deliveredName: (type: string, chosen: readonly string[] | null) => string | null,
): Promise<{ events: number; deliveries: number }> {
  const scope = await undispatchedScope(storage.db);
  if (scope.length === 0) return { events: 0, deliveries: 0 };
  // Most rounds find nothing: a plain read first, so an idle dispatcher takes no write lock (SQLite).
  const any = await undispatchedEvents(storage.db, scope).select('id').limit(1).executeTakeFirst();
  if (!any) return { events: 0, deliveries: 0 };
  return storage.db.transaction().execute(async (trx) => {
    const events = await undispatchedEvents(trx, scope)
      .select(['id', 'merchant_id', 'type', 'created_at'])
      .orderBy('id')
      .limit(FAN_OUT_BATCH)
      .$call((q) => (storage.dialect === 'postgres' ? q.forUpdate().skipLocked() : q))
      .execute();
    if (events.length === 0) return { events: 0, deliveries: 0 };
    const merchants = [...new Set(events.map((e) => e.merchant_id))];
    const hooks = await trx
      .selectFrom('webhooks')
      .select(['id', 'merchant_id', 'events', 'created_at'])
      .where('merchant_id', 'in', merchants)
      .where('disabled_at', 'is', null)
      .execute();
    const rows: WebhookDeliveriesTable[] = [];
    for (const event of events) {
      for (const hook of hooks) {
        if (hook.merchant_id !== event.merchant_id || hook.created_at > event.created_at) continue;
        const name = deliveredName(event.type, hook.events === null ? null : (JSON.parse(hook.events) as string[]));
        if (name !== null) rows.push(deliveryRow(hook.id, event.id, name, at));
      }
    }
    for (let i = 0; i < rows.length; i += INSERT_CHUNK) {
      await trx
        .insertInto('webhook_deliveries')
        .values(rows.slice(i, i + INSERT_CHUNK))
        .onConflict((oc) => oc.columns(['webhook_id', 'event_id']).doNothing())
        .execute();
    }
    await trx
      .updateTable('events')
      .set({ dispatched_at: at })
      .where('id', 'in', events.map((e) => e.id))
      .execute();
    return { events: events.length, deliveries: rows.length };
  });
}

export function deliveryRow(webhookId: string, eventId: string, eventType: string, at: string): WebhookDeliveriesTable {
  return {
    id: newId('delivery'),
    webhook_id: webhookId,
    event_id: eventId,
    event_type: eventType,
    state: 'pending',
    attempts: 0,
    next_attempt_at: at,
    last_attempt_at: null,
    last_status_code: null,
    last_error: null,
    last_response_body: null,
    last_duration_ms: null,
    created_at: at,
  };
}

/** A claimed delivery with everything needed to send it. `attempt` fences the outcome (recordOutcome). */
export type ClaimedDelivery = {
  id: string;
  webhookId: string;
  eventId: string;
  eventType: string;
  attempt: number;
  url: string;
  secrets: string[];
  eventCreatedAt: string;
  payload: string;
  /** The webhook had a run of failures when claimed: a success must end it. */
  webhookFailing: boolean;
};

/**
 * Claims due deliveries: at most `limit` in all and at most `perWebhook(id)` for each webhook
 * (what this process still has room for), never for a webhook in `busy`. A claim counts the
 * attempt and pushes next_attempt_at to `leaseUntil`: if this process dies before recording the
 * outcome, the delivery falls due again then and another attempt is made (at least once).
 */
export async function claimDueDeliveries(
  storage: Storage,
  opts: { at: string; leaseUntil: string; limit: number; busy: string[]; roomFor: (webhookId: string) => number },
): Promise<ClaimedDelivery[]> {
  const due = await storage.db
    .selectFrom('webhook_deliveries')
    .select('id')
    .where('state', '=', 'pending')
    .where('next_attempt_at', '<=', opts.at)
    .limit(1)
    .executeTakeFirst();
  if (!due) return [];
  return storage.db.transaction().execute(async (trx) => {
    const candidates = await trx
      .selectFrom('webhook_deliveries as d')
      .innerJoin('webhooks as w', 'w.id', 'd.webhook_id')
      .innerJoin('events as e', 'e.id', 'd.event_id')
      .select(['d.id', 'd.webhook_id', 'd.event_id', 'd.event_type', 'd.attempts'])
      .select(['w.url', 'w.secret', 'w.previous_secret', 'w.previous_secret_expires_at', 'w.failing_since', 'e.created_at', 'e.payload'])
      .where('d.state', '=', 'pending')
      .where('d.next_attempt_at', '<=', opts.at)
      // A disabled webhook's deliveries wait; re-enabling it sends them.
      .where('w.disabled_at', 'is', null)
      .$if(opts.busy.length > 0, (q) => q.where('d.webhook_id', 'not in', opts.busy))
      .orderBy('d.next_attempt_at')
      .limit(opts.limit * 4)
      .$call((q) => (storage.dialect === 'postgres' ? q.forUpdate('d').skipLocked() : q))
      .execute();
    const taken = new Map<string, number>();
    const chosen = candidates
      .filter((c) => {
        const n = taken.get(c.webhook_id) ?? 0;
        if (n >= opts.roomFor(c.webhook_id)) return false;
        taken.set(c.webhook_id, n + 1);
        return true;
      })
      .slice(0, opts.limit);
    if (chosen.length === 0) return [];
    await trx
      .updateTable('webhook_deliveries')
      .set((eb) => ({ attempts: eb('attempts', '+', 1), next_attempt_at: opts.leaseUntil, last_attempt_at: opts.at }))
      .where('id', 'in', chosen.map((c) => c.id))
      .execute();
    return chosen.map((c) => ({
      id: c.id,
      webhookId: c.webhook_id,
      eventId: c.event_id,
      eventType: c.event_type,
      attempt: Number(c.attempts) + 1,
      url: c.url,
      secrets: c.previous_secret && c.previous_secret_expires_at && c.previous_secret_expires_at > opts.at ? [c.secret, c.previous_secret] : [c.secret],
      eventCreatedAt: c.created_at,
      payload: c.payload,
      webhookFailing: c.failing_since !== null,
    }));
  });
}

export type AttemptOutcome = {
  at: string;
  statusCode: number | null;
  error: string | null;
  /** The start of the answer's body; null when none came. */
  responseBody: string | null;
  durationMs: number;
  succeeded: boolean;
  /** When to try again; null: no attempts left (the delivery is failed). Ignored on success. */
  nextAttemptAt: string | null;
  /** Decides, from when the webhook's failures began, whether this failure disables it. */
  disableIfFailingSince: (failingSince: string) => boolean;
};

/**
 * Records an attempt's outcome, unless the delivery was claimed again meanwhile (its lease ran
 * out): then the newer attempt owns it. A success clears the webhook's run of failures; a failure
 * starts one, or disables the webhook once the run is long enough. Returns the delivery's new state.
 */
export async function recordOutcome(
  storage: Storage,
  delivery: Pick<ClaimedDelivery, 'id' | 'webhookId' | 'attempt' | 'webhookFailing'>,
  outcome: AttemptOutcome,
): Promise<'succeeded' | 'pending' | 'failed' | 'superseded'> {
  const state = outcome.succeeded ? 'succeeded' : outcome.nextAttemptAt === null ? 'failed' : 'pending';
  const markDelivery = async (db: Kysely<Database>) => {
    const result = await db
      .updateTable('webhook_deliveries')
      .set({
        state,
        next_attempt_at: state === 'pending' ? outcome.nextAttemptAt : null,
        last_status_code: outcome.statusCode,
        last_error: outcome.error,
        last_response_body: outcome.responseBody,
        last_duration_ms: outcome.durationMs,
      })
      .where('id', '=', delivery.id)
      .where('attempts', '=', delivery.attempt)
      .where('state', '=', 'pending')
      .executeTakeFirst();
    return Number(result.numUpdatedRows) === 1;
  };
  // The usual case, one statement: a success at a webhook that was not failing changes nothing else.
  // (A failure recorded meanwhile by another send keeps its failing_since until the next success.)
  if (outcome.succeeded && !delivery.webhookFailing) return (await markDelivery(storage.db)) ? state : 'superseded';
  return storage.db.transaction().execute(async (trx) => {
    if (!(await markDelivery(trx))) return 'superseded';
    if (outcome.succeeded) {
      await trx.updateTable('webhooks').set({ failing_since: null }).where('id', '=', delivery.webhookId).execute();
      return state;
    }
    const hook = await trx.selectFrom('webhooks').select(['failing_since']).where('id', '=', delivery.webhookId).executeTakeFirst();
    if (!hook) return state;
    if (hook.failing_since === null) {
      await trx.updateTable('webhooks').set({ failing_since: outcome.at }).where('id', '=', delivery.webhookId).execute();
    } else if (outcome.disableIfFailingSince(hook.failing_since)) {
      await trx.updateTable('webhooks').set({ disabled_at: outcome.at }).where('id', '=', delivery.webhookId).where('disabled_at', 'is', null).execute();
    }
    return state;
  });
}

/** When the oldest work still waiting became due: an event not yet fanned out, or a delivery past its time. */
export async function oldestDueAt(storage: Storage, at: string): Promise<string | null> {
  const scope = await undispatchedScope(storage.db);
  const event = scope.length === 0 ? undefined : await undispatchedEvents(storage.db, scope).select((eb) => eb.fn.min('created_at').as('t')).executeTakeFirst();
  const delivery = await storage.db
    .selectFrom('webhook_deliveries')
    .select((eb) => eb.fn.min('next_attempt_at').as('t'))
    .where('state', '=', 'pending')
    .where('next_attempt_at', '<=', at)
    .executeTakeFirst();
  const times = [event?.t, delivery?.t].filter((t): t is string => typeof t === 'string');
  return times.length === 0 ? null : times.sort()[0]!;
}
