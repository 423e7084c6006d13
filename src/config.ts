import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { parseMoney } from './domain/money.ts';
import { DEFAULT_CONTEXT_HOLD_TOKENS, DEFAULT_REFERENCE_HOLD_TOKENS } from './providers/estimate.ts';
import { parsePriceOverrides, type PriceOverrideTable } from './domain/base-prices.ts';

/**
 * Every setting Tollgate reads from its environment, in one schema.
 * README's "Configuration" table documents the same names; keep them in step.
 */
const logLevel = z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']);

function jsonOf<T extends z.ZodType>(schema: T, message: string) {
  return z.string().transform((raw, ctx): z.infer<T> => {
    try {
      return schema.parse(JSON.parse(raw));
    } catch {
      ctx.addIssue({ code: 'custom', message });
      return z.NEVER;
    }
  });
}

const flag = z.enum(['true', 'false', '1', '0'], { error: 'must be true, false, 1 or 0' }).transform((v) => v === 'true' || v === '1');

const decimalRate = z
  .string()
  .regex(/^\d+(\.\d{1,10})?$/, 'must be a non-negative decimal with at most 10 fractional digits');

const configSchema = z.object({
  PORT: z.coerce.number().int().min(0).max(65535).default(8080),
  HOST: z.string().min(1).default('127.0.0.1'),
  DATABASE_URL: z
    .string()
    .refine((v) => v.startsWith('sqlite:') || /^postgres(ql)?:\/\//.test(v), {
      message: 'must start with sqlite: or postgres://',
    })
    .optional(),
  /** A streaming replica of DATABASE_URL (PostgreSQL) that report reads go to (decision 0041). */
  DATABASE_READ_URL: z
    .string()
    .refine((v) => /^postgres(ql)?:\/\//.test(v), { message: 'must start with postgres://' })
    .optional(),
  REDIS_URL: z
    .string()
    .refine((v) => /^rediss?:\/\//.test(v), { message: 'must start with redis:// or rediss://' })
    .optional(),
  LOG_LEVEL: logLevel.default('info'),
  /** Service charge as a percentage of the fee, e.g. "1.9" for 1.9 %. */
  SERVICE_CHARGE_RATE: decimalRate.default('0'),
  /** Requests per minute per API key on the standard endpoints. */
  RATE_LIMIT_PER_MINUTE: z.coerce.number().int().min(1).default(1000),
  /** JSON object: provider host -> base URL it is served from (tests point providers at a mock). */
  UPSTREAM_OVERRIDES: jsonOf(
    z.record(z.string(), z.string().url()),
    'must be a JSON object mapping provider hosts to base URLs',
  ).optional(),
  /** Path of a JSON file {"provider/model": {"input": "2.5", "output": "10"}} (per 1M tokens). */
  PRICE_OVERRIDES_FILE: z.string().min(1).optional(),
  /** JSON object: provider id -> managed API key, for any provider (e.g. {"groq": "gsk_…"}). */
  PROVIDER_KEYS: jsonOf(z.record(z.string(), z.string().min(1)), 'must be a JSON object mapping provider ids to API keys').optional(),
  /** JSON array of operator-declared OpenAI-compatible providers: [{"id": "...", "baseUrl": "https://..."}]. */
  CUSTOM_PROVIDERS: jsonOf(
    z.array(z.object({ id: z.string().min(1), baseUrl: z.string().url() })),
    'must be a JSON array of {"id", "baseUrl"} objects',
  ).optional(),
  /** How long to wait for a provider's response headers before answering 504. */
  UPSTREAM_TIMEOUT_MS: z.coerce.number().int().min(1).default(300_000),
  /** Longest silence allowed between two chunks of a provider's body. */
  UPSTREAM_IDLE_TIMEOUT_MS: z.coerce.number().int().min(1).default(300_000),
  /**
   * How long a graceful shutdown waits for requests in flight (a long stream, a client that stopped
   * reading) before it closes their connections; each is then settled from what was relayed.
   */
  SHUTDOWN_GRACE_MS: z.coerce.number().int().min(0).default(25_000),
  /**
   * Where this instance journals forwarded calls before calling their providers (decision 0024),
   * replayed at the next start after a crash; one directory per instance. `off` journals nothing.
   */
  CALL_JOURNAL_DIR: z.string().min(1).optional(),
  /** A hold not settled within this time is released (crash safety). */
  HOLD_TTL_MS: z.coerce.number().int().min(1000).default(15 * 60_000),
  /**
   * PostgreSQL: admissions within one second that make a wallet hot, so this instance admits its
   * requests from a leased slice of it (decision 0013); `off` never leases.
   */
  WALLET_LEASE_HOT_AFTER: z.union([z.literal('off'), z.coerce.number().int().min(0)]).default(32),
  /** A wallet lease unused this long is given back. */
  WALLET_LEASE_IDLE_MS: z.coerce.number().int().min(10).default(2000),
  WALLET_LEASE_TTL_MS: z.coerce.number().int().min(300).default(5000),
  /** How long an admission taken in process stays unwritten: a request answered sooner is written once, by its settlement. */
  ADMISSION_WRITE_DELAY_MS: z.coerce.number().int().min(1).default(50),
  /** When set, GET /metrics answers only `Authorization: Bearer <this token>`. */
  METRICS_TOKEN: z.string().min(16, 'must be at least 16 characters').optional(),
  /**
   * How far V8 lets the old generation grow past what survived its last full collection before
   * collecting again, in percent; `off` keeps V8's own factor (decision 0015).
   */
  HEAP_GROWING_PERCENT: z.union([z.literal('off'), z.coerce.number().int().min(1).max(1000)]).default(30),
  /** This Tollgate's public URL (behind a proxy); checkout tokens carry it. Default: the URL a request reached. */
  PUBLIC_BASE_URL: z.url({ protocol: /^https?$/ }).optional(),
  /** Selects the Stripe payment provider (with STRIPE_WEBHOOK_SECRET); the built-in `test` provider otherwise. */
  STRIPE_SECRET_KEY: z.string().regex(/^(sk|rk)_[A-Za-z0-9_]+$/, 'must be a Stripe secret key (sk_… or rk_…)').optional(),
  /** The signing secret of the Stripe webhook endpoint that calls POST /v1/payments/stripe/webhook. */
  STRIPE_WEBHOOK_SECRET: z.string().regex(/^whsec_[A-Za-z0-9_]+$/, 'must be a Stripe webhook signing secret (whsec_…)').optional(),
  /** The currency every amount is in (wallets, prices, payments): an ISO 4217 code, shown to customers. */
  CURRENCY: z.string().regex(/^[A-Za-z]{3}$/, 'must be an ISO 4217 currency code such as USD').default('USD'),
  /** The currency Stripe charges in: a two-decimal currency, lower-case ISO code; CURRENCY when unset. */
  STRIPE_CURRENCY: z.string().regex(/^[a-z]{3}$/, 'must be a lower-case ISO currency code').optional(),
  /** Another address for Stripe's API (a stand-in for tests); Stripe's own when unset. */
  STRIPE_API_BASE: z.url({ protocol: /^https?$/ }).optional(),
  /** Output tokens assumed for the hold when a request sets no max_tokens. */
  DEFAULT_MAX_OUTPUT_TOKENS: z.coerce.number().int().min(1).default(4096),
  /** Input tokens held for each audio, video or document named by reference (an upload's id or URI), whose size is not known. */
  MEDIA_REFERENCE_HOLD_TOKENS: z.coerce.number().int().min(0).max(100_000_000).default(DEFAULT_REFERENCE_HOLD_TOKENS),
  /** Input tokens held for provider-side context a request names whose size this instance has not learned (decision 0025). */
  PROVIDER_CONTEXT_HOLD_TOKENS: z.coerce.number().int().min(0).max(100_000_000).default(DEFAULT_CONTEXT_HOLD_TOKENS),
  /** Development only: webhooks may use plain http to loopback (and deliveries may reach loopback). */
  WEBHOOK_ALLOW_HTTP_LOOPBACK: flag.default(false),
  /** How long a webhook delivery waits for the receiver's answer. */
  WEBHOOK_TIMEOUT_MS: z.coerce.number().int().min(100).max(60_000).default(10_000),
  /** Webhook deliveries in flight at once in this process, over all endpoints. */
  WEBHOOK_MAX_CONCURRENCY: z.coerce.number().int().min(1).max(1024).default(64),
  WEBHOOK_RETENTION_DAYS: z.coerce.number().int().min(1).max(3650).default(30),
  /** Whether anyone reaching the dashboard may create a merchant account (sign-up page). */
  DASHBOARD_SIGNUP: flag.default(false),
  /**
   * Which proxies in front may tell the client's address and scheme (X-Forwarded-For/-Proto):
   * `false` (none, the default), `true` (any), a hop count, or comma-separated addresses/CIDRs.
   */
  TRUST_PROXY: z
    .string()
    .trim()
    .regex(/^(true|false|\d{1,2}|[0-9A-Fa-f.:/]+(\s*,\s*[0-9A-Fa-f.:/]+)*)$/, 'must be true, false, a hop count, or comma-separated addresses/CIDRs')
    .default('false'),
  OPENAI_API_KEY: z.string().min(1).optional(),
  ANTHROPIC_API_KEY: z.string().min(1).optional(),
  GOOGLE_API_KEY: z.string().min(1).optional(),
});

export type Config = {
  port: number;
  host: string;
  databaseUrl: string;
  /** Where reports read (a streaming replica); undefined reads everything from databaseUrl. */
  databaseReadUrl: string | undefined;
  redisUrl: string | undefined;
  logLevel: z.infer<typeof logLevel>;
  /** Percent of the fee, in 1e-10 units. */
  serviceChargeRate: bigint;
  priceOverrides: PriceOverrideTable;
  rateLimitPerMinute: number;
  upstreamOverrides: Record<string, string>;
  providerKeys: Record<string, string>;
  customProviders: { id: string; baseUrl: string }[];
  upstreamTimeoutMs: number;
  upstreamIdleTimeoutMs: number;
  shutdownGraceMs: number;
  holdTtlMs: number;
  /** This instance's call journal (decision 0024); null when off. */
  callJournalDir: string | null;
  /** Null when wallet leases are off. */
  walletLeaseHotAfter: number | null;
  walletLeaseIdleMs: number;
  /** A wallet lease's own lifetime, renewed while its instance lives (decision 0019). */
  walletLeaseTtlMs: number;
  /** How long an admission taken in process stays unwritten (decision 0011). */
  admissionWriteDelayMs: number;
  defaultMaxOutputTokens: number;
  /** Input tokens held for a medium named by reference (decision 0019): an allowance, not a bound. */
  mediaReferenceHoldTokens: number;
  providerContextHoldTokens: number;
  metricsToken: string | undefined;
  publicBaseUrl: string | undefined;
  /** Null when V8 keeps its own heap growing factor. */
  heapGrowingPercent: number | null;
  webhooks: { allowHttpLoopback: boolean; timeoutMs: number; maxConcurrency: number; retentionDays: number };
  dashboardSignup: boolean;
  /** Fastify's trustProxy: whom X-Forwarded-For/-Proto are believed from. */
  trustProxy: boolean | number | string[];
  /** ISO 4217, upper-case: what every amount is in. */
  currency: string;
  /** Null when the built-in `test` payment provider is used. */
  stripe: { secretKey: string; webhookSecret: string; currency: string; apiBase: URL | undefined } | null;
};

export const DEFAULT_DATABASE_URL = 'sqlite:./data/tollgate.db';

export class ConfigError extends Error {}

/**
 * The call journal's directory: as set, else beside an embedded database's file (one process owns
 * it, so one journal). On PostgreSQL, where instances share the database, the default is named
 * for the database and the port, so two instances on one host (different ports) keep apart and a
 * restarted one finds its own. An in-memory database does not outlive its process, so a journal
 * would have nothing to replay into: none.
 */
function callJournalDirOf(setting: string | undefined, databaseUrl: string, port: number): string | null {
  if (setting === 'off') return null;
  if (setting !== undefined) return setting;
  if (!databaseUrl.startsWith('sqlite:')) return `./data/calls/${createHash('sha256').update(databaseUrl).digest('hex').slice(0, 12)}-${port}`;
  const file = databaseUrl.slice('sqlite:'.length);
  return file === ':memory:' ? null : `${file}.calls`;
}

/** Reads the configuration, or throws a ConfigError that names every offending variable. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const result = configSchema.safeParse(pickEmptyAsUnset(env));
  if (!result.success) {
    const lines = result.error.issues.map((i) => `  ${i.path.join('.')}: ${i.message}`);
    throw new ConfigError(`Invalid configuration:\n${lines.join('\n')}`);
  }
  const c = result.data;
  if (Boolean(c.STRIPE_SECRET_KEY) !== Boolean(c.STRIPE_WEBHOOK_SECRET)) {
    throw new ConfigError('Invalid configuration:\n  STRIPE_SECRET_KEY and STRIPE_WEBHOOK_SECRET go together: set both to use Stripe, or neither.');
  }
  // STRIPE_CURRENCY alone (the older setting) names the currency too.
  const currency = (c.STRIPE_CURRENCY !== undefined && !env.CURRENCY ? c.STRIPE_CURRENCY : c.CURRENCY).toUpperCase();
  if (c.STRIPE_CURRENCY !== undefined && c.STRIPE_CURRENCY.toUpperCase() !== currency) {
    throw new ConfigError(`Invalid configuration:\n  STRIPE_CURRENCY (${c.STRIPE_CURRENCY}) differs from CURRENCY (${currency}): amounts are in one currency; set one of them.`);
  }
  if (c.DATABASE_READ_URL !== undefined && !/^postgres(ql)?:\/\//.test(c.DATABASE_URL ?? DEFAULT_DATABASE_URL)) {
    throw new ConfigError('Invalid configuration:\n  DATABASE_READ_URL: a read replica needs a PostgreSQL DATABASE_URL.');
  }
  const providerKeys: Record<string, string> = { ...c.PROVIDER_KEYS };
  if (c.OPENAI_API_KEY) providerKeys.openai = c.OPENAI_API_KEY;
  if (c.ANTHROPIC_API_KEY) providerKeys.anthropic = c.ANTHROPIC_API_KEY;
  if (c.GOOGLE_API_KEY) providerKeys.google = c.GOOGLE_API_KEY;
  return {
    port: c.PORT,
    host: c.HOST,
    databaseUrl: c.DATABASE_URL ?? DEFAULT_DATABASE_URL,
    databaseReadUrl: c.DATABASE_READ_URL,
    redisUrl: c.REDIS_URL,
    logLevel: c.LOG_LEVEL,
    serviceChargeRate: parseMoney(c.SERVICE_CHARGE_RATE),
    priceOverrides: c.PRICE_OVERRIDES_FILE ? loadPriceOverrides(c.PRICE_OVERRIDES_FILE) : new Map(),
    rateLimitPerMinute: c.RATE_LIMIT_PER_MINUTE,
    upstreamOverrides: c.UPSTREAM_OVERRIDES ?? {},
    providerKeys,
    customProviders: c.CUSTOM_PROVIDERS ?? [],
    upstreamTimeoutMs: c.UPSTREAM_TIMEOUT_MS,
    upstreamIdleTimeoutMs: c.UPSTREAM_IDLE_TIMEOUT_MS,
    shutdownGraceMs: c.SHUTDOWN_GRACE_MS,
    holdTtlMs: c.HOLD_TTL_MS,
    callJournalDir: callJournalDirOf(c.CALL_JOURNAL_DIR, c.DATABASE_URL ?? DEFAULT_DATABASE_URL, c.PORT),
    walletLeaseHotAfter: c.WALLET_LEASE_HOT_AFTER === 'off' ? null : c.WALLET_LEASE_HOT_AFTER,
    walletLeaseIdleMs: c.WALLET_LEASE_IDLE_MS,
    walletLeaseTtlMs: c.WALLET_LEASE_TTL_MS,
    admissionWriteDelayMs: c.ADMISSION_WRITE_DELAY_MS,
    defaultMaxOutputTokens: c.DEFAULT_MAX_OUTPUT_TOKENS,
    mediaReferenceHoldTokens: c.MEDIA_REFERENCE_HOLD_TOKENS,
    providerContextHoldTokens: c.PROVIDER_CONTEXT_HOLD_TOKENS,
    metricsToken: c.METRICS_TOKEN,
    publicBaseUrl: c.PUBLIC_BASE_URL,
    heapGrowingPercent: c.HEAP_GROWING_PERCENT === 'off' ? null : c.HEAP_GROWING_PERCENT,
    webhooks: {
      allowHttpLoopback: c.WEBHOOK_ALLOW_HTTP_LOOPBACK,
      timeoutMs: c.WEBHOOK_TIMEOUT_MS,
      maxConcurrency: c.WEBHOOK_MAX_CONCURRENCY,
      retentionDays: c.WEBHOOK_RETENTION_DAYS,
    },
    dashboardSignup: c.DASHBOARD_SIGNUP,
    trustProxy: trustProxyOf(c.TRUST_PROXY),
    currency,
    stripe:
      c.STRIPE_SECRET_KEY && c.STRIPE_WEBHOOK_SECRET
        ? { secretKey: c.STRIPE_SECRET_KEY, webhookSecret: c.STRIPE_WEBHOOK_SECRET, currency: currency.toLowerCase(), apiBase: c.STRIPE_API_BASE ? new URL(c.STRIPE_API_BASE) : undefined }
        : null,
  };
}

function trustProxyOf(value: string): boolean | number | string[] {
  if (value === 'true' || value === 'false') return value === 'true';
  if (/^\d+$/.test(value)) return Number(value);
  return value.split(',').map((part) => part.trim());
}

function loadPriceOverrides(path: string): PriceOverrideTable {
  try {
    return parsePriceOverrides(JSON.parse(readFileSync(path, 'utf8')) as Parameters<typeof parsePriceOverrides>[0]);
  } catch (e) {
    throw new ConfigError(`Invalid configuration:\n  PRICE_OVERRIDES_FILE: ${(e as Error).message}`);
  }
}

/** An exported-but-empty variable (`PORT=`) means "use the default", as most tools treat it. */
function pickEmptyAsUnset(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const key of Object.keys(configSchema.shape)) {
    const value = env[key];
    if (value !== undefined && value !== '') out[key] = value;
  }
  return out;
}
