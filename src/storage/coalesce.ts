import DataLoader from 'dataloader';

/** Reads that may share one query: each key maps to at most one row. */
export type Coalesced<K, V> = { load(key: K): Promise<V | undefined> };

/** Enough keys for every request a busy instance has in hand; well below any engine's parameter limit. */
const MAX_KEYS = 500;

/**
 * Lookups made during one turn of the event loop go to the database as one query. Under load many
 * requests are parsed in the same turn, so each pays a fraction of a round trip instead of a whole
 * one. Nothing is cached: every lookup runs in a query issued after it was asked for, so it sees
 * every change committed before it, exactly as a query of its own would.
 */
export function coalesced<K, V>(
  keyOf: (key: K) => string,
  fetchMany: (keys: K[]) => Promise<Map<string, V>>,
): Coalesced<K, V> {
  return new DataLoader<K, V | undefined, string>(
    async (keys) => {
      const unique = [...new Map(keys.map((k) => [keyOf(k), k])).values()];
      const found = await fetchMany(unique);
      return keys.map((k) => found.get(keyOf(k)));
    },
    { cache: false, maxBatchSize: MAX_KEYS, batchScheduleFn: (run) => setImmediate(run) },
  );
}

/** Groups keys by merchant, so each group reads as `merchant_id = ? and <column> in (…)`. */
export function byMerchant<K extends { merchantId: string }>(keys: K[]): Map<string, K[]> {
  const groups = new Map<string, K[]>();
  for (const key of keys) {
    const group = groups.get(key.merchantId);
    if (group) group.push(key);
    else groups.set(key.merchantId, [key]);
  }
  return groups;
}
