import { sql, type Expression, type ExpressionBuilder, type SqlBool } from 'kysely';
import { byMerchant, coalesced, type Coalesced } from './coalesce.ts';
import type { ConnectionRow } from './connections.ts';
import type { Storage } from './db.ts';
import type { MeterRow } from './meters.ts';
import type { RequestRow } from './requests.ts';
import type { Database } from './schema.ts';

/** A lookup within one merchant: a request_id, a customer id or secret, a meter slug or secret. */
export type MerchantKey = { merchantId: string; value: string };

export type ChargeParty = Pick<ConnectionRow, 'id' | 'wallet_id'>;

/** A lookup that remembers what it found; `forget` drops an answer found to be stale. */
export type Remembered<V> = Coalesced<MerchantKey, V> & { forget(key: MerchantKey): void };

/**
 * The reads POST /requests makes. Customers and meters are remembered: which wallet a customer
 * id or secret names, and which meter a slug or secret names, change only when they are deleted,
 * and the charge itself re-reads the meter and checks both are still live (chargeBatch), so a
 * remembered answer can be stale only in a way the charge detects. Records are never remembered.
 */
export type RequestLookups = {
  recordByRequestId: Coalesced<MerchantKey, RequestRow>;
  customerById: Remembered<ChargeParty>;
  customerBySecret: Remembered<ChargeParty>;
  meterBySlug: Remembered<MeterRow>;
  meterBySecret: Remembered<MeterRow>;
};

const keyOf = (k: MerchantKey) => `${k.merchantId}\n${k.value}`;

export function createRequestLookups({ db }: Storage): RequestLookups {
  return {
    recordByRequestId: coalesced(keyOf, async (keys) => {
      const rows = await db.selectFrom('requests').selectAll().where(inMerchants(keys, 'requests', 'request_id')).execute();
      return new Map(rows.map((r) => [keyOf({ merchantId: r.merchant_id, value: r.request_id }), r]));
    }),
    customerById: remembered(
      coalesced(keyOf, async (keys) => {
        const rows = await liveConnections(db).where(inMerchants(keys, 'connections', 'id')).execute();
        return new Map(rows.map((r) => [keyOf({ merchantId: r.merchant_id, value: r.id }), { id: r.id, wallet_id: r.wallet_id }]));
      }),
    ),
    customerBySecret: remembered(
      coalesced(keyOf, async (keys) => {
        const rows = await liveConnections(db).where(inMerchants(keys, 'connections', 'secret')).execute();
        return new Map(rows.map((r) => [keyOf({ merchantId: r.merchant_id, value: r.secret }), { id: r.id, wallet_id: r.wallet_id }]));
      }),
    ),
    meterBySlug: remembered(
      coalesced(keyOf, async (keys) => {
        const rows = await liveMeters(db).where(inMerchants(keys, 'meters', 'slug')).execute();
        return new Map(rows.map((r) => [keyOf({ merchantId: r.merchant_id, value: r.slug }), r]));
      }),
    ),
    meterBySecret: remembered(
      coalesced(keyOf, async (keys) => {
        const rows = await liveMeters(db).where(inMerchants(keys, 'meters', 'secret')).execute();
        return new Map(rows.map((r) => [keyOf({ merchantId: r.merchant_id, value: r.secret }), r]));
      }),
    ),
  };
}

/** Enough for every customer and meter in steady use; the oldest answer goes first. */
const REMEMBERED_ENTRIES = 10_000;

function remembered<V>(lookup: Coalesced<MerchantKey, V>): Remembered<V> {
  const found = new Map<string, V>();
  return {
    async load(key) {
      const known = found.get(keyOf(key));
      if (known !== undefined) return known;
      const value = await lookup.load(key);
      // Misses are not remembered: a customer or meter created a moment later must be found.
      if (value !== undefined) {
        if (found.size >= REMEMBERED_ENTRIES) found.delete(found.keys().next().value!);
        found.set(keyOf(key), value);
      }
      return value;
    },
    forget(key) {
      found.delete(keyOf(key));
    },
  };
}

function liveConnections(db: Storage['db']) {
  return db.selectFrom('connections').select(['id', 'merchant_id', 'wallet_id', 'secret']).where('deleted_at', 'is', null);
}

function liveMeters(db: Storage['db']) {
  return db.selectFrom('meters').selectAll().where('deleted_at', 'is', null);
}

type Table = 'requests' | 'connections' | 'meters';

/** `(merchant_id = ? and column in (…)) or …`, one group per merchant: the indexes on (merchant_id, column) serve it. */
function inMerchants<T extends Table>(keys: MerchantKey[], _table: T, column: 'request_id' | 'id' | 'secret' | 'slug') {
  return (eb: ExpressionBuilder<Database, T>): Expression<SqlBool> =>
    eb.or(
      [...byMerchant(keys)].map(([merchantId, group]) =>
        eb.and([
          eb(sql.ref('merchant_id'), '=', merchantId),
          eb(
            sql.ref(column),
            'in',
            group.map((k) => k.value),
          ),
        ]),
      ),
    );
}
