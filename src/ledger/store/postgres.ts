/**
 * The ledger's statements written for PostgreSQL alone: the ones that do in one statement, or in
 * a pipelined transaction, what the portable path does in several round trips. Each decides
 * nothing itself: its callers decided with src/ledger/decide/, and what a statement checks in SQL
 * is the same rule, named where it is restated.
 */
import pg from 'pg';
import { CompiledQuery } from 'kysely';
import { batchStatement, jsonRows, JsonRows, repeatedRequests, REQUEST_ID_TAKEN, takenRequests } from '../../storage/batch-write.ts';
import { prepared, type Storage } from '../../storage/db.ts';
import type { MeterRow } from '../../storage/meters.ts';
import { inPipelinedTransaction } from '../../storage/pipelined-transaction.ts';
import { metadataRows, type RequestRow } from '../../storage/requests.ts';
import { planCreditKey } from '../../storage/subscriptions.ts';
import type { HoldRow } from '../holds.ts';
import { counterId, counterRow, countersInKeyOrder, type CounterKey } from '../tier-counters.ts';
import type { WalletRow } from '../wallets.ts';
import { inLockOrder } from '../decide/lock-order.ts';
import type { ChargeBatchLocked, ChargeBatchSteps } from './types.ts';

/** What a batch of admissions holds, decided in process (admit.ts admitInOneStatement). */
export type AdmissionBatch = {
  /** What each paying wallet must cover, by wallet. */
  need: Map<string, bigint>;
  /** Wallets some member may only take the prepaid balance of (ledger/decide/balance.ts availableFor). */
  prepaidOnly: Set<string>;
  holds: HoldRow[];
  records: RequestRow[];
};

/**
 * Admits a batch in one statement, committed on its own, when every paying wallet can cover all
 * the batch holds on it; then every member passes the reference's check in any order. It locks
 * the wallets, checks each (balance − held, less its plan credit when prepaid-only, covers its
 * need; a wallet whose overrun counts, ledger/decide/overrun.ts overrunCounts, is left to the
 * ordinary path), and only if all pass writes the holds, the wallets' `held` (ending any overrun:
 * nothing was in flight) and the pending records. False, with nothing written, when any wallet
 * falls short: the batch is then decided member by member.
 */
export async function admitWholeBatch(storage: Storage, batch: AdmissionBatch): Promise<boolean> {
  // The statement's text depends on which tables get rows, not on how many: it is prepared once.
  const json = new JsonRows();
  // What each wallet must cover, typed by the holds table's columns of the same names.
  const needRows = json.select('holds', [...batch.need].map(([wallet_id, amount]) => ({ wallet_id, amount })));
  // Always present (maybe empty), so the text stays the same.
  const prepaidOnlyRows = json.select('wallets', [...batch.prepaidOnly].map((id) => ({ id })), ['id']);
  const metadata = metadataRows(batch.records);
  const ifOk = 'where (select ok from ok)';
  const text = prepared(`
    with need as (${needRows}),
    prepaid_only as (${prepaidOnlyRows}),
    locked as (select id, balance, held, overrun, cycle_credit, bundle_credit from wallets where id in (select wallet_id from need) order by id for update),
    ok as (
      select count(*) = (select count(*) from need) as ok
      from locked join need on need.wallet_id = locked.id
      where locked.balance - locked.held
          - case when locked.id in (select id from prepaid_only) then locked.cycle_credit + locked.bundle_credit else 0 end >= need.amount
        and (locked.overrun = 0 or locked.held = 0)
    ),
    upd as (
      update wallets set held = wallets.held + need.amount, overrun = 0 from need
      where wallets.id = need.wallet_id and (select ok from ok)
      returning wallets.id
    ),
    h as (${json.insert('holds', batch.holds)} ${ifOk}),
    r as (${json.insert('requests', batch.records)} ${ifOk})
    ${metadata.length > 0 ? `, m as (${json.insert('request_metadata', metadata)} ${ifOk})` : ''}
    select ok from ok`);
  const { rows } = await storage.db.executeQuery(CompiledQuery.raw(text, json.values) as CompiledQuery<{ ok: boolean }>);
  return rows[0]?.ok === true;
}

/**
 * A POST /requests charge batch's transaction, pipelined: BEGIN goes with the lock statement,
 * COMMIT with the write statement, two round trips in all.
 */
export function inChargeBatchTransaction<T>(storage: Storage, pool: pg.Pool, work: (steps: ChargeBatchSteps) => Promise<T>): Promise<T> {
  return inPipelinedTransaction(pool, (trx) =>
    work({
      lock: async (counterKeys, walletIds, meterIds) =>
        lockedOf(await trx.begin<LockedRow>(LOCK_COUNTERS_AND_WALLETS, lockValues(counterKeys, walletIds, meterIds))),
      write: async (rows) => {
        if (rows.requests.length === 0) {
          await trx.commit();
          return { taken: [] };
        }
        const repeated = repeatedRequests(rows.requests);
        if (repeated.length > 0) return { taken: repeated };
        const { text, values } = batchStatement(rows);
        try {
          await trx.commit({ text, values });
          return { taken: [] };
        } catch (error) {
          if (!(error instanceof pg.DatabaseError && error.constraint === REQUEST_ID_TAKEN)) throw error;
          const taken = await takenRequests(storage.db, rows.requests);
          if (taken.length === 0) throw error;
          return { taken };
        }
      },
    }),
  );
}

/**
 * The lock statement's values: counters in key order, wallet ids in id order (every writer locks
 * in one global order: tier counters by key, then wallets by id), and the batch's meters.
 */
function lockValues(counterKeys: CounterKey[], walletIds: string[], meterIds: string[]): [string, string[], string[]] {
  const counters = jsonRows(countersInKeyOrder(counterKeys).map((k) => counterRow(k, 0n)));
  return [counters, inLockOrder(walletIds), meterIds];
}

function lockedOf(rows: LockedRow[]): ChargeBatchLocked {
  const locked: ChargeBatchLocked = { positions: new Map(), wallets: new Map(), liveCustomers: new Set(), drawingPlanCredit: new Set(), meters: new Map() };
  for (const r of rows) {
    if (r.kind === 'meter') {
      const meter = JSON.parse(r.meter_row!) as MeterRow;
      locked.meters.set(meter.id, meter);
      continue;
    }
    if (r.kind === 'plan') {
      locked.drawingPlanCredit.add(planCreditKey({ connectionId: r.connection_id!, meterId: r.meter_id! }));
      continue;
    }
    if (r.kind === 'counter') {
      locked.positions.set(counterId({ meterId: r.meter_id!, connectionId: r.connection_id!, periodStart: r.period_start! }), BigInt(r.units!));
      continue;
    }
    const { id, merchant_id, owner_type, balance, cycle_credit, bundle_credit, held, created_at } = r;
    locked.wallets.set(id!, {
      id: id!,
      merchant_id: merchant_id!,
      owner_type: owner_type!,
      balance: balance!,
      cycle_credit: cycle_credit!,
      bundle_credit: bundle_credit!,
      held: held!,
      created_at: created_at!,
    });
    if (r.live_customer_id) locked.liveCustomers.add(r.live_customer_id);
  }
  return locked;
}

/**
 * Tier counters, then wallets, locked in one statement on PostgreSQL: the wallets' scan waits on a
 * count of the counters upsert, so every counter is locked before the first wallet is. The same
 * statement tells which of the wallets' live customers draw plan credit on the batch's meters
 * (pairsDrawingPlanCredit's rule), so the request path asks nothing of subscriptions, and reads
 * the batch's live meters, each as its row in JSON (every meter column is text, so JSON keeps it
 * exactly): a read of their own, on another connection, cost every batch a second backend's
 * wake-up and a query of its own. Fixed text, prepared once per connection: the counters travel
 * as JSON rows, wallet and meter ids as arrays.
 */
const LOCK_COUNTERS_AND_WALLETS = prepared(`
  with counters as (
    insert into meter_usage_counters (meter_id, connection_id, period_start, units)
    select meter_id, connection_id, period_start, units from json_populate_recordset(null::meter_usage_counters, $1)
    on conflict (meter_id, connection_id, period_start) do update set units = meter_usage_counters.units
    returning meter_id, connection_id, period_start, units),
  locked as (
    select wallets.*, connections.id as live_customer_id
    from wallets left join connections on connections.wallet_id = wallets.id and connections.deleted_at is null
    where wallets.id = any($2::text[]) and (select count(*) from counters) >= 0
    order by wallets.id
    for update of wallets)
  select 'counter' as kind, meter_id, connection_id, period_start, units,
    null::text as id, null::text as merchant_id, null::text as owner_type, null::bigint as balance,
    null::bigint as cycle_credit, null::bigint as bundle_credit, null::bigint as held, null::text as created_at,
    null::text as live_customer_id, null::text as meter_row
  from counters
  union all
  select 'wallet', null, null, null, null, id, merchant_id, owner_type, balance, cycle_credit, bundle_credit, held, created_at,
    live_customer_id, null
  from locked
  union all
  select 'plan', plan_meters.meter_id, subscriptions.connection_id, null, null, null, null, null, null, null, null, null, null, null, null
  from locked
  join subscriptions on subscriptions.connection_id = locked.live_customer_id and subscriptions.status in ('active', 'past_due')
  join plan_meters on plan_meters.plan_id = subscriptions.plan_id and plan_meters.meter_id = any($3::text[])
  union all
  select 'meter', null, null, null, null, null, null, null, null, null, null, null, null, null, row_to_json(meters)::text
  from meters where meters.id = any($3::text[]) and meters.deleted_at is null`);

type LockedRow = { kind: 'counter' | 'wallet' | 'plan' | 'meter'; meter_id: string | null; connection_id: string | null; period_start: string | null; units: bigint | null } & {
  [K in keyof WalletRow]: WalletRow[K] | null;
} & { live_customer_id: string | null; meter_row: string | null };
