/**
 * Tier counters: how far into its meter's tiers a customer's usage is this period. Every charge
 * prices at its counter's position, read and locked in its transaction (lockUsageCounters), and
 * moves it on.
 */
import type { Transaction } from 'kysely';
import type { Storage } from '../storage/db.ts';
import { COUNTER_KEY, type Database, type MeterUsageCountersTable } from '../storage/schema.ts';

/** Tiers accumulate over the UTC calendar month until subscriptions define a cycle. */
export function monthStart(now: Date): string {
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)).toISOString();
}

export type CounterKey = { meterId: string; connectionId: string; periodStart: string };

/** A tier counter at its new position, member by member (a spread with more members is slow in V8, decision 0008). */
export function counterAt(key: CounterKey, units: bigint): CounterKey & { units: bigint } {
  return { meterId: key.meterId, connectionId: key.connectionId, periodStart: key.periodStart, units };
}

/** The tier position a request prices at; only where a meter's own pricing applies. */
export function counterKeyOf(input: { meter: { id: string } | null; pricing?: unknown; connection: { id: string } | null }, now: Date): CounterKey | null {
  if (!input.meter || input.pricing) return null;
  return { meterId: input.meter.id, connectionId: input.connection?.id ?? '', periodStart: monthStart(now) };
}

/**
 * Sorting by this string sorts by (meter, customer, period) as the database orders the key (the
 * separator sorts below every id character, and '' — no customer — first), so every writer that
 * locks counters in key order, in SQL or here, locks them in the same order.
 */
export const counterId = (key: CounterKey): string => `${key.meterId}\n${key.connectionId}\n${key.periodStart}`;

/** Each counter once, in key order: the order every writer locks counters in. */
export function countersInKeyOrder(keys: CounterKey[]): CounterKey[] {
  return [...new Map(keys.map((k) => [counterId(k), k])).entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, k]) => k);
}

/** A counter as its table's row, at `units`. */
export function counterRow(counter: CounterKey, units: bigint): MeterUsageCountersTable {
  return { meter_id: counter.meterId, connection_id: counter.connectionId, period_start: counter.periodStart, units };
}

/**
 * Reads the (meter, connection) positions for the period and locks them until the transaction
 * ends, so two concurrent requests can never price at the same tier position. One statement: the
 * upsert creates a missing row and locks an existing one (its no-op update takes the row lock),
 * in key order, so transactions locking several counters cannot deadlock.
 */
export async function lockUsageCounters(
  trx: Transaction<Database>,
  _dialect: Storage['dialect'],
  keys: CounterKey[],
): Promise<Map<string, bigint>> {
  const unique = countersInKeyOrder(keys);
  if (unique.length === 0) return new Map();
  const rows = await trx
    .insertInto('meter_usage_counters')
    .values(unique.map((k) => counterRow(k, 0n)))
    .onConflict((oc) => oc.columns([...COUNTER_KEY]).doUpdateSet((eb) => ({ units: eb.ref('meter_usage_counters.units') })))
    .returning(['meter_id', 'connection_id', 'period_start', 'units'])
    .execute();
  return new Map(
    rows.map((r) => [counterId({ meterId: r.meter_id, connectionId: r.connection_id, periodStart: r.period_start }), BigInt(r.units)]),
  );
}

export async function saveUsageCounters(trx: Transaction<Database>, counters: (CounterKey & { units: bigint })[]): Promise<void> {
  if (counters.length === 0) return;
  const ordered = [...counters].sort((a, b) => (counterId(a) < counterId(b) ? -1 : 1));
  await trx
    .insertInto('meter_usage_counters')
    .values(ordered.map((c) => counterRow(c, c.units)))
    .onConflict((oc) => oc.columns([...COUNTER_KEY]).doUpdateSet((eb) => ({ units: eb.ref('excluded.units') })))
    .execute();
}
