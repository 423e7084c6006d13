import { buildApp } from '../../src/app.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { MemoryRateLimiter } from '../../src/http/rate-limit.ts';
import type { App } from '../../src/http/types.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import type { TestClock } from './clock.ts';
import { freshDatabase } from './databases.ts';
import { startStripeStandIn, type StripeStandIn } from './stripe-stand-in.ts';

export type StripeApp = { stripeApi: StripeStandIn; config: Config; storage: Storage; app: App; secretKey: string };

/**
 * An app on a fresh database that takes payments through the Stripe adapter, pointed at a local
 * stand-in for Stripe's API (`secrets`: the API key and webhook secret it is configured with), and
 * one merchant's secret key. The caller closes it with `closeStripeApp`.
 */
export async function startAppOnStripeStandIn(
  dialect: 'sqlite' | 'postgres',
  clock: TestClock,
  secrets: { apiKey: string; webhookSecret: string },
  /** More settings, e.g. `CURRENCY`. */
  env: Record<string, string> = {},
): Promise<StripeApp> {
  const stripeApi = await startStripeStandIn(secrets.apiKey);
  const database = await freshDatabase(dialect);
  const config = loadConfig({
    LOG_LEVEL: 'silent',
    DATABASE_URL: database.url,
    STRIPE_SECRET_KEY: secrets.apiKey,
    STRIPE_WEBHOOK_SECRET: secrets.webhookSecret,
    STRIPE_API_BASE: stripeApi.url,
    ...env,
  });
  const storage = openStorage(database.url, { poolSize: 10 });
  await migrateToLatest(storage);
  const app = await buildApp({ config, storage, clock, rateLimiter: new MemoryRateLimiter() });
  await app.ready();
  const secretKey = (await createMerchant(storage, { name: 'Stripe shop' }, new Date().toISOString())).secretKey;
  return { stripeApi, config, storage, app, secretKey };
}

/**
 * Listens on a loopback port (a browser and the stand-in's hosted page reach the app there) and
 * has the stand-in send Stripe's events to the app's webhook route, signed at the app's time.
 * Returns the app's base URL.
 */
export async function listenForStripe(started: StripeApp, clock: TestClock, webhookSecret: string): Promise<string> {
  await started.app.listen({ port: 0, host: '127.0.0.1' });
  const address = started.app.server.address();
  const base = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
  started.stripeApi.sendWebhooksTo({ url: `${base}/v1/payments/stripe/webhook`, secret: webhookSecret, now: () => clock.now() });
  return base;
}

export async function closeStripeApp(started: StripeApp | undefined): Promise<void> {
  await started?.app.close();
  await started?.storage.close();
  await started?.stripeApi.close();
}
