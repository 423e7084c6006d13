import type { AddressInfo } from 'node:net';
import type { DestinationStream } from 'pino';
import { afterAll, beforeAll } from 'vitest';
import { buildApp } from '../../src/app.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { MemoryRateLimiter, type RateLimiter } from '../../src/http/rate-limit.ts';
import type { App } from '../../src/http/types.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { TestPaymentProvider } from '../../src/payments/test-provider.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { TestClock } from './clock.ts';
import type { CallJournal } from '../../src/ledger/journal/journal.ts';
import { freshDatabase, type TestDatabase } from './databases.ts';
import { live } from './live.ts';
import { until } from './until.ts';

export type Merchant = { merchantId: string; secretKey: string; walletId: string };

/** Settlement runs after the answer is sent, so a test waits this long for a record to leave `pending`. */
const SETTLE_WAIT_MS = 5_000;

export type CustomerWithMeter = { customerId: string; walletId: string; meterId: string; meterSlug: string };

const PER_REQUEST_METER = { name: 'Per request', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.25' }] };

/** The base64 JSON forward token the published client makes: the merchant's key, a customer and a meter. */
export function forwardToken(secretKey: string, customerId: string, meterSlug: string): string {
  return Buffer.from(JSON.stringify({ secret_key: secretKey, customer_id: customerId, meter_slug: meterSlug })).toString('base64');
}

export type TestApp = {
  app: App;
  storage: Storage;
  database: TestDatabase;
  config: Config;
  /**
   * The app's clock, which stands still until the test moves it: a test advances it instead of
   * sleeping past a TTL or a refill.
   */
  clock: TestClock;
  /** The app's payment provider: the built-in test provider, which records every charge. */
  payments: TestPaymentProvider;
  merchant: Merchant;
  /** Another merchant, for proving tenant isolation. */
  newMerchant(name?: string): Promise<Merchant>;
  /** Starts listening on a loopback port and returns the base URL, e.g. http://127.0.0.1:PORT */
  listen(): Promise<string>;
  auth(key?: string): { authorization: string };
  /**
   * Polls GET /v1/requests/{id} (as this app's merchant unless `headers` says otherwise) until the
   * record is no longer pending, and returns its JSON; throws naming the request id after the deadline.
   */
  // Records are asserted field by field, so they stay as loosely typed as inject's own json().
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  settledRecord(requestId: string | null, headers?: { authorization: string }): Promise<any>;
  /**
   * For charging a customer as a merchant (this app's unless `secretKey` says otherwise): a new
   * customer whose wallet holds `credit` (nothing without it), and a new meter — by default a fixed
   * 0.25 per request.
   */
  customerWithMeter(opts: { credit?: string; meter?: Record<string, unknown>; secretKey?: string }): Promise<CustomerWithMeter>;
  close(): Promise<void>;
};

export async function startTestApp(
  dialect: TestDatabase['dialect'],
  opts: {
    env?: Record<string, string>;
    rateLimiter?: RateLimiter;
    database?: TestDatabase;
    payments?: TestPaymentProvider;
    /** Receives the app's log lines (set LOG_LEVEL in env, else nothing is logged). */
    logStream?: DestinationStream;
    /** The app's clock (a new TestClock without it); apps sharing a database share one to agree on time. */
    clock?: TestClock;
    /** A call journal for the gateway (decision 0024); apps have none unless given one. */
    journal?: CallJournal;
  } = {},
): Promise<TestApp> {
  const database = opts.database ?? (await freshDatabase(dialect));
  const config = loadConfig({ LOG_LEVEL: 'silent', DATABASE_URL: database.url, ...opts.env });
  const storage = openStorage(database.url, { poolSize: 10, readUrl: config.databaseReadUrl });
  await migrateToLatest(storage);
  const clock = opts.clock ?? new TestClock();
  const payments = opts.payments ?? new TestPaymentProvider();
  const app = await buildApp({
    config,
    storage,
    clock,
    payments,
    rateLimiter: opts.rateLimiter ?? new MemoryRateLimiter(),
    ...(opts.logStream ? { logStream: opts.logStream } : {}),
    ...(opts.journal ? { journal: opts.journal } : {}),
  });
  await app.ready();

  const newMerchant = async (name = 'Test merchant'): Promise<Merchant> => {
    const { merchant, secretKey } = await createMerchant(storage, { name }, dateOf(clock).toISOString());
    return { merchantId: merchant.id, secretKey, walletId: merchant.wallet_id };
  };
  const merchant = await newMerchant('Acme');
  const auth = (key = merchant.secretKey) => ({ authorization: `Bearer ${key}` });

  const settledRecord = async (requestId: string | null, headers = auth()) => {
    let lastAnswer = 'no answer yet';
    return until(
      async () => {
        const res = await app.inject({ method: 'GET', url: `/v1/requests/${requestId}`, headers });
        const record = res.statusCode === 200 ? res.json() : undefined;
        lastAnswer = record ? 'still pending' : `HTTP ${res.statusCode}`;
        return record && record.status !== 'pending' ? record : undefined;
      },
      () => `request ${requestId} to settle (last answer: ${lastAnswer})`,
      { timeoutMs: SETTLE_WAIT_MS, intervalMs: 20 },
    );
  };

  const customerWithMeter = async (opts: { credit?: string; meter?: Record<string, unknown>; secretKey?: string }) => {
    const headers = auth(opts.secretKey);
    const customer = (await app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json();
    if (opts.credit !== undefined) await creditWallet(storage, customer.wallet.wallet_id, parseMoney(opts.credit), dateOf(clock).toISOString());
    const meter = (await app.inject({ method: 'POST', url: '/v1/meters', headers, payload: opts.meter ?? PER_REQUEST_METER })).json();
    return { customerId: customer.customer_id, walletId: customer.wallet.wallet_id, meterId: meter.meter_id, meterSlug: meter.meter_slug } as CustomerWithMeter;
  };

  return {
    app,
    storage,
    database,
    config,
    clock,
    payments,
    merchant,
    newMerchant,
    listen: async () => {
      await app.listen({ port: 0, host: '127.0.0.1' });
      const { port } = app.server.address() as AddressInfo;
      return `http://127.0.0.1:${port}`;
    },
    auth,
    settledRecord,
    customerWithMeter,
    close: async () => {
      await app.close();
      await storage.close();
    },
  };
}

/**
 * The test app of a describe block: started before its tests (beforeAll) and closed after them
 * (afterAll). What it returns reads through to the started app (see `live`), so the block's tests
 * use it as they would the app itself.
 */
export function useTestApp(dialect: TestDatabase['dialect'], opts: Parameters<typeof startTestApp>[1] = {}): TestApp {
  let started: TestApp | undefined;
  beforeAll(async () => {
    started = await startTestApp(dialect, opts);
  });
  afterAll(async () => {
    await started?.close();
  });
  return live('the test app', () => started);
}
