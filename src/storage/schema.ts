/**
 * Row types of every table, as Kysely sees them.
 * Money columns are BIGINT counts of 1e-10 units and always arrive as bigint
 * (see db.ts: SQLite runs with safe integers, PostgreSQL parses int8 to BigInt).
 * Timestamps are ISO-8601 UTC strings with milliseconds, so they sort as text on both engines.
 */
export type Dialect = 'sqlite' | 'postgres';

export interface MerchantsTable {
  id: string;
  name: string;
  email: string | null;
  password_hash: string | null;
  /** Percent of the fee, as 1e-10 units; null = operator default. */
  service_charge_rate: bigint | null;
  wallet_id: string;
  created_at: string;
}

export interface WalletsTable {
  id: string;
  merchant_id: string;
  owner_type: 'merchant' | 'connection';
  balance: bigint;
  created_at: string;
}

export interface SecretKeysTable {
  id: string;
  merchant_id: string;
  name: string;
  key_hash: string;
  key_hint: string;
  created_at: string;
  revoked_at: string | null;
}

export interface MetersTable {
  id: string;
  merchant_id: string;
  slug: string;
  name: string;
  secret: string;
  rate_type: 'fixed' | 'percentage';
  tier_type: 'tokens_1m' | 'characters_1m' | 'minutes' | 'requests';
  token_basis: 'input+output' | 'output';
  base_cost_payer: 'wallet' | 'merchant';
  service_charge_payer: 'wallet' | 'merchant';
  /** JSON: [{start: number, rate: "<10-place decimal>"}] */
  tiers: string;
  created_at: string;
  deleted_at: string | null;
}

export interface ConnectionsTable {
  id: string;
  merchant_id: string;
  wallet_id: string;
  secret: string;
  reference_id: string | null;
  first_name: string | null;
  last_name: string | null;
  email: string | null;
  phone: string | null;
  /** JSON object or null */
  metadata: string | null;
  created_at: string;
  deleted_at: string | null;
}

export interface IdempotencyKeysTable {
  scope: string;
  key: string;
  request_hash: string;
  state: 'in_flight' | 'done';
  response_status: number | null;
  response_body: string | null;
  created_at: string;
  expires_at: string;
}

export interface Database {
  merchants: MerchantsTable;
  wallets: WalletsTable;
  secret_keys: SecretKeysTable;
  meters: MetersTable;
  connections: ConnectionsTable;
  idempotency_keys: IdempotencyKeysTable;
}
