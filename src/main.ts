import { Redis } from 'ioredis';
import { buildApp } from './app.ts';
import { sweepExpiredHolds } from './gateway/settle.ts';
import type { Config } from './config.ts';
import { MemoryRateLimiter, RedisRateLimiter, type RateLimiter } from './http/rate-limit.ts';
import type { App } from './http/types.ts';
import { openStorage, type Storage } from './storage/db.ts';
import { purgeExpiredIdempotencyKeys } from './storage/idempotency.ts';
import { migrateToLatest } from './storage/migrate.ts';

export type RunningServer = { app: App; url: string; stop(): Promise<void> };

const SWEEP_INTERVAL_MS = 30_000;

/** config -> storage -> migrations -> buildApp() -> listen. */
export async function startServer(
  config: Config,
  opts: { sweepIntervalMs?: number } = {},
): Promise<RunningServer> {
  const storage = openStorage(config.databaseUrl);
  await migrateToLatest(storage);
  const { limiter, redis } = makeRateLimiter(config);
  const app = await buildApp({ config, storage, rateLimiter: limiter });
  const url = await app.listen({ port: config.port, host: config.host });
  const sweeper = startSweeper(storage, app, opts.sweepIntervalMs ?? SWEEP_INTERVAL_MS);
  app.log.info({ database: storage.describe, redis: Boolean(redis) }, `Tollgate listening on ${url}`);
  return {
    app,
    url,
    stop: async () => {
      clearInterval(sweeper);
      await shutdown(app, storage, limiter, redis);
    },
  };
}

/**
 * Periodic clean-up of what a crash or time leaves behind: holds whose settlement never came (their
 * records marked `error`), and idempotency keys past their 24 h or their lease, which would
 * otherwise only go when the same key came back.
 */
function startSweeper(storage: Storage, app: App, intervalMs: number): NodeJS.Timeout {
  const timer = setInterval(() => {
    sweepExpiredHolds(storage).catch((err: unknown) => app.log.error({ err }, 'hold sweep failed'));
    purgeExpiredIdempotencyKeys(storage.db, new Date().toISOString()).catch((err: unknown) =>
      app.log.error({ err }, 'idempotency key purge failed'),
    );
  }, intervalMs);
  timer.unref();
  return timer;
}

function makeRateLimiter(config: Config): { limiter: RateLimiter; redis: Redis | null } {
  if (!config.redisUrl) return { limiter: new MemoryRateLimiter(), redis: null };
  const redis = new Redis(config.redisUrl, { maxRetriesPerRequest: 2, enableOfflineQueue: true });
  return { limiter: new RedisRateLimiter(redis), redis };
}

async function shutdown(app: App, storage: Storage, limiter: RateLimiter, redis: Redis | null): Promise<void> {
  // Stop accepting, let in-flight requests finish, then release connections.
  await app.close();
  await limiter.close();
  await storage.close();
  if (redis) await redis.quit();
}

/** Stops gracefully on SIGINT/SIGTERM; a second signal forces the exit. */
export function stopOnSignals(server: RunningServer): void {
  let stopping = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) process.exit(1);
    stopping = true;
    server.app.log.info({ signal }, 'shutting down');
    server.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        server.app.log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
}
