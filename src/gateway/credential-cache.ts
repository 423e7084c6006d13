/**
 * A short-lived, in-process cache of resolved gateway credentials (who pays, which meter), so a
 * forwarded request does not read the secret key, merchant, customer and meter on every call.
 *
 * Correctness (docs/decisions/0008-gateway-fast-path.md):
 * - Within this process a change takes effect at once: every UPDATE or DELETE on the tables a
 *   credential is made of (secret keys, spend keys, merchants, customers, meters, and for plan
 *   credit subscriptions and plans' meters, whose inserts count too) that goes
 *   through this process's database handle empties the cache. A Kysely plugin sees them, so no
 *   route has to remember to call anything. Updates of a spend key that only move its counters
 *   (spend, requests, token bucket) are not changes of the credential and are ignored.
 * - A resolution that was in flight when a change happened is not stored, and for a short quiet
 *   period after a change nothing is stored (the change's transaction may not have committed
 *   yet when the plugin sees its statement).
 * - Other instances sharing the database see a change within ENTRY_TTL_MS, the staleness bound.
 *   Balances, holds and spend-key limits are never cached: they are decided in the database at
 *   admission, where a revoked spend key is also refused.
 * - Only successful resolutions are stored; unknown credentials always go to the database.
 */
import type { KyselyPlugin, OperationNode, PluginTransformQueryArgs, PluginTransformResultArgs, QueryResult, RootOperationNode, UnknownRow } from 'kysely';
import { systemClock, type Clock } from '../domain/clock.ts';
import type { Storage } from '../storage/db.ts';
import type { BillingContext } from '../ledger/billing.ts';
import { CREDENTIAL_STALENESS_MS } from '../ledger/spend-key-limits.ts';

/** How long another instance may keep using a credential after it changed. */
const ENTRY_TTL_MS = CREDENTIAL_STALENESS_MS;
/** After a change is seen, resolutions are not stored for this long (its transaction commits meanwhile). */
const QUIET_MS = 1_000;
const MAX_ENTRIES = 10_000;

const WATCHED_TABLES = new Set(['secret_keys', 'spend_keys', 'merchants', 'connections', 'meters', 'subscriptions', 'plan_meters']);

/**
 * What a credential says of plan credit (BillingContext.drawsPlanCredit: the meter is linked to the
 * plan of the customer's live subscription) changes when a subscription starts, ends or changes
 * plan, or a plan's meters change: inserts into these tables too, and of a subscription's updates
 * only those of these columns (a renewal's claim is not a change).
 */
const INSERTS_WATCHED = new Set(['subscriptions', 'plan_meters']);
const SUBSCRIPTION_LINK_COLUMNS = new Set(['plan_id', 'status', 'connection_id']);

/** Spend-key columns that move with use; changing only these does not change the credential. */
const SPEND_KEY_COUNTERS = new Set([
  'spend_cycle_start',
  'current_spend',
  'reserved_spend',
  'overrun',
  'total_spend',
  'request_cycle_start',
  'current_requests',
  'total_requests',
  'spend_event_cycle',
  'request_event_cycle',
  'bucket_units',
  'bucket_at_ms',
  'last_used_at',
]);

type Entry = { value: BillingContext; expiresAt: number };

export class CredentialCache {
  readonly #entries = new Map<string, Entry>();
  readonly #clock: Clock;
  #generation = 0;
  #quietUntil = 0;

  constructor(clock: Clock = systemClock) {
    this.#clock = clock;
  }

  /** Forgets every entry; resolutions in flight are not stored. */
  invalidate(): void {
    this.#generation++;
    this.#quietUntil = this.#clock.now() + QUIET_MS;
    this.#entries.clear();
  }

  get size(): number {
    return this.#entries.size;
  }

  async resolve(credential: string, load: () => Promise<BillingContext>): Promise<BillingContext> {
    const now = this.#clock.now();
    const hit = this.#entries.get(credential);
    if (hit && hit.expiresAt > now) return hit.value;
    if (hit) this.#entries.delete(credential);
    const generation = this.#generation;
    const value = await load();
    const after = this.#clock.now();
    if (generation === this.#generation && after >= this.#quietUntil) {
      if (this.#entries.size >= MAX_ENTRIES) this.#entries.delete(this.#entries.keys().next().value!);
      this.#entries.set(credential, { value, expiresAt: after + ENTRY_TTL_MS });
    }
    return value;
  }
}

/**
 * Routes the storage handle's queries through a plugin that empties `cache` whenever a credential
 * table changes (see the module comment). The app does it once, before its first request.
 */
export function watchCredentialChanges(storage: Storage, cache: CredentialCache): void {
  storage.db = storage.db.withPlugin(new CredentialChangeWatcher(cache));
}

class CredentialChangeWatcher implements KyselyPlugin {
  readonly #cache: CredentialCache;
  readonly #changes = new WeakSet<object>();

  constructor(cache: CredentialCache) {
    this.#cache = cache;
  }

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    if (changesCredentials(args.node)) {
      this.#cache.invalidate();
      this.#changes.add(args.queryId);
    }
    return args.node;
  }

  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    // Again once the statement ran: a resolution that read the old row meanwhile is not stored.
    if (this.#changes.has(args.queryId)) this.#cache.invalidate();
    return args.result;
  }
}

/** Whether a statement changes what a credential resolves to (counters of spend keys do not). */
export function changesCredentials(node: RootOperationNode): boolean {
  if (node.kind === 'UpdateQueryNode') {
    const table = tableName(node.table);
    if (!table || !WATCHED_TABLES.has(table)) return false;
    if (table === 'subscriptions') {
      return (node.updates ?? []).some((u) => {
        const column = columnName(u.column);
        return column === null || SUBSCRIPTION_LINK_COLUMNS.has(column);
      });
    }
    if (table !== 'spend_keys') return true;
    return (node.updates ?? []).some((u) => {
      const column = columnName(u.column);
      return column === null || !SPEND_KEY_COUNTERS.has(column);
    });
  }
  if (node.kind === 'InsertQueryNode') {
    const table = tableName(node.into);
    return table !== null && INSERTS_WATCHED.has(table);
  }
  if (node.kind === 'DeleteQueryNode') {
    return node.from.froms.some((from) => {
      const table = tableName(from);
      return table !== null && WATCHED_TABLES.has(table);
    });
  }
  return false;
}

type Named = OperationNode & { table?: { identifier?: { name?: string } }; node?: OperationNode; column?: { name?: string } };

function tableName(node: OperationNode | undefined): string | null {
  let n = node as Named | undefined;
  if (n?.kind === 'AliasNode') n = n.node as Named | undefined;
  return n?.kind === 'TableNode' ? (n.table?.identifier?.name ?? null) : null;
}

function columnName(node: OperationNode): string | null {
  const n = node as Named;
  return n.kind === 'ColumnNode' ? (n.column?.name ?? null) : null;
}
