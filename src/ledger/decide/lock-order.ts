/**
 * The one global lock order every ledger writer takes its row locks in, so that no two
 * transactions can deadlock: tier counters by key, then wallets by id, then hold rows, then spend
 * keys by id. Each kind is locked once, in ascending order, through these.
 */

/** Each id once, ascending: the order wallets and spend keys are locked (and written) in. */
export function inLockOrder(ids: Iterable<string>): string[] {
  return [...new Set(ids)].sort();
}

/** Entries keyed by id, in the lock order of their ids. */
export function entriesInLockOrder<T>(byId: Map<string, T>): [string, T][] {
  return [...byId].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}
