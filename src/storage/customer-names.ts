import type { Storage } from './db.ts';

/** How many ids one query names (a page shows far fewer; the bound keeps the IN list small). */
const MAX_IDS = 500;

/**
 * The display names of a merchant's customers by id: first and last name, else email, else
 * reference; an id it does not find (another merchant's, or deleted) is simply absent.
 */
export async function customerNames(storage: Storage, merchantId: string, ids: readonly (string | null | undefined)[]): Promise<Map<string, string>> {
  const wanted = [...new Set(ids.filter((id): id is string => typeof id === 'string' && id !== ''))].slice(0, MAX_IDS);
  if (wanted.length === 0) return new Map();
  const rows = await storage.db
    .selectFrom('connections')
    .select(['id', 'first_name', 'last_name', 'email', 'reference_id'])
    .where('merchant_id', '=', merchantId)
    .where('id', 'in', wanted)
    .execute();
  return new Map(rows.map((r) => [r.id, [r.first_name, r.last_name].filter(Boolean).join(' ') || r.email || r.reference_id || r.id]));
}
