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
  /** Total: cycle_credit + bundle_credit + prepaid. */
  balance: bigint;
  cycle_credit: bigint;
  bundle_credit: bigint;
  /** Sum of the wallet's active holds; available = balance - held. */
  held: bigint;
  /** The last overrun's excess per thousand of its hold (0 none): admissions count what requests in flight may overrun at that rate (decision 0025). */
  overrun?: number;
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

export interface LedgerTransactionsTable {
  id: string;
  kind: string;
  merchant_id: string;
  reference: string | null;
  description: string | null;
  created_at: string;
}

export interface LedgerPostingsTable {
  id: string;
  transaction_id: string;
  account: string;
  amount: bigint;
  created_at: string;
}

export interface HoldsTable {
  id: string;
  wallet_id: string;
  reference: string;
  amount: bigint;
  status: 'active' | 'settled' | 'released' | 'expired';
  created_at: string;
  expires_at: string;
}

export interface RequestsTable {
  id: string;
  merchant_id: string;
  request_id: string;
  body_hash: string | null;
  status: 'pending' | 'completed' | 'error';
  connection_id: string | null;
  meter_id: string | null;
  provider: string;
  /** The model the provider served (from its answer), else the one the request named. */
  model: string | null;
  /** The model the request named, when the provider answered under another name; else null. */
  requested_model: string | null;
  endpoint: string;
  provider_key_type: 'managed' | 'unmanaged';
  response_id: string | null;
  provider_timestamp: string | null;
  metadata: string;
  input_tokens: bigint;
  output_tokens: bigint;
  /** Parts of input_tokens read from / written to the provider's prompt cache. */
  cached_input_tokens: bigint;
  cache_write_input_tokens: bigint;
  /** Part of output_tokens the model spent reasoning (thinking), where the provider reports it. */
  reasoning_tokens: bigint;
  /** Images an image generation made. */
  output_images: bigint;
  /** The unit the base cost was priced by; null when no provider price was known. */
  price_unit: 'tokens' | 'minutes' | 'images' | 'characters' | null;
  input_characters: bigint;
  output_characters: bigint;
  /** Decimal seconds, at most 6 fractional digits. */
  input_seconds: string;
  output_seconds: string;
  input_cost: bigint;
  output_cost: bigint;
  base_cost_charged: number | bigint;
  base_cost_payer: 'wallet' | 'merchant';
  fee_amount: bigint;
  rate_type: 'fixed' | 'percentage';
  token_basis: 'input+output' | 'output';
  /** JSON array of breakdown items, money as decimal strings. */
  breakdown: string;
  service_charge_amount: bigint;
  service_charge_payer: 'wallet' | 'merchant';
  total_request_cost: bigint;
  total_wallet_cost: bigint;
  total_merchant_cost: bigint;
  usage_estimated: number | bigint;
  /** A forwarded pending record: what its hold was estimated from (JSON), charged if a crash loses its settlement. */
  hold_estimate?: string | null;
  created_at: string;
  completed_at: string | null;
}

export interface RequestMetadataTable {
  request_pk: string;
  merchant_id: string;
  key: string;
  value: string;
  created_at: string;
}

/**
 * The sums every usage rollup table accumulates (rollups.ts ROLLUP_SUMS), whatever its key. Each
 * sum but the count of requests is carried (exact-sum.ts): the column holds its remainder by 10^18
 * and `<sum>_carry` how many 10^18 it holds besides (null for none).
 */
export interface UsageRollupSums {
  requests: bigint;
  tokens: bigint;
  tokens_carry: bigint | null;
  usage_cost: bigint;
  usage_cost_carry: bigint | null;
  fee: bigint;
  fee_carry: bigint | null;
  service_charge: bigint;
  service_charge_carry: bigint | null;
  request_cost: bigint;
  request_cost_carry: bigint | null;
  wallet_cost: bigint;
  wallet_cost_carry: bigint | null;
  merchant_cost: bigint;
  merchant_cost_carry: bigint | null;
}

export interface UsageRollupsTable extends UsageRollupSums {
  merchant_id: string;
  /** Start of a 15-minute UTC bucket, ISO text. */
  bucket_start: string;
  /** '' when the request had no connection / meter. */
  connection_id: string;
  meter_id: string;
}

/**
 * The same 15-minute sums as usage_rollups, once per metadata pair a record carries: GET /usage
 * filtered by one pair reads these instead of the records.
 */
export interface UsageRollupsByMetadataTable extends UsageRollupsTable {
  key: string;
  value: string;
}

/**
 * The same 15-minute sums at the grain a report reads (decision 0042): per merchant (dimension
 * 'total', key and value ''), per customer ('customer', key = connection id), per meter ('meter',
 * key = meter id) and per metadata pair ('metadata', key and value of the pair).
 */
export interface UsageRollupsGroupedTable extends UsageRollupSums {
  merchant_id: string;
  dimension: 'total' | 'customer' | 'meter' | 'metadata';
  key: string;
  value: string;
  bucket_start: string;
}

/** The same sums per UTC day, per customer and per model (key '' for records naming no model): decision 0042. */
export interface UsageRollupsByDayTable extends UsageRollupSums {
  merchant_id: string;
  dimension: 'customer' | 'model';
  /** Midnight UTC of the day, ISO text. */
  day_start: string;
  key: string;
}

export interface MeterUsageCountersTable {
  meter_id: string;
  connection_id: string;
  period_start: string;
  units: bigint;
}

/** meter_usage_counters' primary key columns: what an upsert of a tier counter conflicts on. */
export const COUNTER_KEY = ['meter_id', 'connection_id', 'period_start'] as const;

export interface EventsTable {
  id: string;
  merchant_id: string;
  type: string;
  /** JSON of the event's data object. */
  payload: string;
  created_at: string;
  /** Set once the webhook dispatcher made the event's deliveries; written only by it. */
  dispatched_at?: string | null;
}

export interface WebhooksTable {
  id: string;
  merchant_id: string;
  name: string;
  url: string;
  /** JSON array of chosen event names, or null for every event. */
  events: string | null;
  secret: string;
  previous_secret: string | null;
  previous_secret_expires_at: string | null;
  failing_since: string | null;
  disabled_at: string | null;
  created_at: string;
}

export type DeliveryState = 'pending' | 'succeeded' | 'failed';

export interface WebhookDeliveriesTable {
  id: string;
  webhook_id: string;
  event_id: string;
  event_type: string;
  state: DeliveryState;
  attempts: number;
  next_attempt_at: string | null;
  last_attempt_at: string | null;
  last_status_code: number | null;
  last_error: string | null;
  /** The start of the last answer's body (at most 1 KiB, UTF-8); null when none came. */
  last_response_body: string | null;
  /** How long the last attempt's exchange took, measured (not a clock reading). */
  last_duration_ms: number | null;
  created_at: string;
}

export interface SpendKeysTable {
  id: string;
  merchant_id: string;
  wallet_id: string;
  connection_id: string | null;
  name: string;
  status: 'active' | 'paused';
  request_shape: 'openai' | 'anthropic';
  key_hash: string;
  key_preview: string;
  /** JSON array of strings, or null = any. */
  allowed_models: string | null;
  allowed_providers: string | null;
  spend_limit_amount: bigint | null;
  spend_limit_cycle: 'daily' | 'weekly' | 'monthly' | 'total' | null;
  request_limit_count: bigint | null;
  request_limit_cycle: 'daily' | 'weekly' | 'monthly' | 'total' | null;
  rate_rpm: bigint | null;
  rate_burst: bigint | null;
  expires_at: string | null;
  spend_cycle_start: string;
  current_spend: bigint;
  reserved_spend: bigint;
  /** The last overrun's excess per thousand of its reservation (0 none): counted against the limit while anything is reserved (decision 0025). */
  overrun?: number;
  total_spend: bigint;
  request_cycle_start: string;
  current_requests: bigint;
  total_requests: bigint;
  spend_event_cycle: string | null;
  request_event_cycle: string | null;
  bucket_units: bigint;
  bucket_at_ms: bigint;
  last_used_at: string | null;
  created_at: string;
  revoked_at: string | null;
}

export interface SpendKeyReservationsTable {
  request_pk: string;
  spend_key_id: string;
  amount: bigint;
  created_at: string;
}

export interface WalletKeysTable {
  id: string;
  merchant_id: string;
  wallet_id: string;
  connection_id: string | null;
  name: string;
  key_hash: string;
  key_preview: string;
  last_used_at: string | null;
  created_at: string;
  revoked_at: string | null;
}

export type BillingInterval = 'day' | 'week' | 'month' | 'year';
export type RolloverType = 'full' | 'none';

export interface PlansTable {
  id: string;
  merchant_id: string;
  name: string;
  period_amount: bigint;
  included_credit: bigint;
  billing_interval: BillingInterval;
  rollover_type: RolloverType;
  bundle_rollover_type: RolloverType;
  default_auto_top_up_bundle_id: string | null;
  created_at: string;
  deleted_at: string | null;
}

export interface PlanMetersTable {
  plan_id: string;
  meter_id: string;
}

export interface CreditBundlesTable {
  id: string;
  merchant_id: string;
  plan_id: string;
  name: string;
  cost: bigint;
  credit_amount: bigint;
  created_at: string;
  deleted_at: string | null;
}

export interface PaymentMethodsTable {
  id: string;
  merchant_id: string;
  connection_id: string;
  provider: string;
  provider_ref: string;
  provider_customer_ref: string | null;
  label: string;
  created_at: string;
}

/** `incomplete`: created, its first payment not yet confirmed; never listed. */
export type SubscriptionStatus = 'incomplete' | 'active' | 'past_due' | 'cancelled';

export interface SubscriptionsTable {
  id: string;
  merchant_id: string;
  connection_id: string;
  plan_id: string;
  status: SubscriptionStatus;
  auto_top_up_bundle_id: string | null;
  started_at: string;
  cancelled_at: string | null;
  cycle_start_at: string;
  cycle_end_at: string;
  /** Cycles end at this time plus whole intervals; null only on rows older than migration 0013. */
  cycle_anchor_at: string | null;
  pending_plan_id: string | null;
  cancel_at_cycle_end: number | bigint;
  claimed_until: string | null;
  failed_attempts: number | bigint;
  next_attempt_at: string | null;
  created_at: string;
}

export type PaymentStatus = 'pending' | 'requires_action' | 'succeeded' | 'failed';

export interface PaymentsTable {
  id: string;
  merchant_id: string;
  connection_id: string | null;
  provider: string;
  provider_ref: string | null;
  purpose: 'checkout' | 'renewal' | 'auto_top_up';
  reference: string;
  amount: bigint;
  status: PaymentStatus;
  failure_reason: string | null;
  created_at: string;
  updated_at: string;
  /** A plan period's payment: the reference of the cycle credit (`plan_credit`) it paid for. */
  credit_reference: string | null;
}

export interface RefundsTable {
  id: string;
  merchant_id: string;
  payment_id: string;
  amount: bigint;
  credit_amount: bigint;
  wallet_id: string | null;
  /** Where the credit is taken back from; `cycle` for a plan period's payment (decision 0044). */
  bucket: 'prepaid' | 'bundle' | 'cycle' | null;
  provider_ref: string | null;
  status: 'pending' | 'succeeded' | 'failed';
  reason: string | null;
  failure_reason: string | null;
  created_at: string;
  updated_at: string;
}

export type CheckoutMode = 'onboarding' | 'topup' | 'subscription' | 'credit_bundle';

export interface CheckoutSessionsTable {
  id: string;
  merchant_id: string;
  mode: CheckoutMode;
  origin_url: string;
  reference_id: string | null;
  connection_id: string | null;
  plan_id: string | null;
  credit_bundle_id: string | null;
  subscription_id: string | null;
  token_hash: string;
  expires_at: string;
  completed_at: string | null;
  created_at: string;
  /** What the page collected for the customer the session will create (JSON), kept once it is paid. */
  contact: string | null;
}

export interface ProviderEventsTable {
  provider: string;
  event_id: string;
  type: string;
  received_at: string;
}

/** A dashboard sign-in; the cookie carries the token, the table only its hash. */
export interface DashboardSessionsTable {
  token_hash: string;
  merchant_id: string;
  csrf_token: string;
  created_at: string;
  expires_at: string;
}

/** A one-time CLI authorization code (hash only): 60 s, single use. */
export interface CliAuthCodesTable {
  code_hash: string;
  merchant_id: string;
  created_at: string;
  expires_at: string;
  used_at: string | null;
}

/** A one-time password-reset link (hash only): expiring, single use. */
export interface PasswordResetsTable {
  token_hash: string;
  merchant_id: string;
  created_at: string;
  expires_at: string;
  used_at: string | null;
}

/** Secrets generated once per installation (e.g. the cookie-signing key). */
export interface ServerSecretsTable {
  name: string;
  value: string;
  created_at: string;
}

export type AlertKind = 'low_balance' | 'spend_threshold';
export type AlertPeriod = 'day' | 'month' | 'total';

/** An alert rule (decision 0043): one subject, a threshold, and the state of its last crossing. */
export interface AlertsTable {
  id: string;
  merchant_id: string;
  kind: AlertKind;
  connection_id: string | null;
  spend_key_id: string | null;
  threshold: bigint;
  /** The spend window of a spend_threshold rule; null for low_balance. */
  period: AlertPeriod | null;
  enabled: number | bigint;
  /** Set when the rule fired and has not re-armed since; null while armed. */
  fired_at: string | null;
  /** The period (its start) a spend_threshold rule fired in: a later period re-arms it. */
  fired_period: string | null;
  baseline_period: string | null;
  baseline_spend: bigint | null;
  revision: number | bigint;
  created_at: string;
  updated_at: string;
}

/** One crossing of an alert rule, with the event that reported it. */
export interface AlertFiringsTable {
  id: string;
  merchant_id: string;
  alert_id: string;
  value: bigint;
  threshold: bigint;
  period_start: string | null;
  event_id: string;
  fired_at: string;
}

export interface Database {
  merchants: MerchantsTable;
  wallets: WalletsTable;
  secret_keys: SecretKeysTable;
  meters: MetersTable;
  connections: ConnectionsTable;
  idempotency_keys: IdempotencyKeysTable;
  ledger_transactions: LedgerTransactionsTable;
  ledger_postings: LedgerPostingsTable;
  holds: HoldsTable;
  requests: RequestsTable;
  request_metadata: RequestMetadataTable;
  usage_rollups: UsageRollupsTable;
  usage_rollups_by_metadata: UsageRollupsByMetadataTable;
  usage_rollups_grouped: UsageRollupsGroupedTable;
  usage_rollups_by_day: UsageRollupsByDayTable;
  meter_usage_counters: MeterUsageCountersTable;
  events: EventsTable;
  webhooks: WebhooksTable;
  webhook_deliveries: WebhookDeliveriesTable;
  spend_keys: SpendKeysTable;
  spend_key_reservations: SpendKeyReservationsTable;
  wallet_keys: WalletKeysTable;
  plans: PlansTable;
  plan_meters: PlanMetersTable;
  credit_bundles: CreditBundlesTable;
  payment_methods: PaymentMethodsTable;
  subscriptions: SubscriptionsTable;
  payments: PaymentsTable;
  refunds: RefundsTable;
  checkout_sessions: CheckoutSessionsTable;
  provider_events: ProviderEventsTable;
  dashboard_sessions: DashboardSessionsTable;
  cli_auth_codes: CliAuthCodesTable;
  password_resets: PasswordResetsTable;
  server_secrets: ServerSecretsTable;
  alerts: AlertsTable;
  alert_firings: AlertFiringsTable;
}
