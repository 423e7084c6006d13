import v8 from 'node:v8';
import { Redis } from 'ioredis';
import { buildApp } from './app.ts';
import { startRenewalScheduler } from './commerce/renewals.ts';
import { startPaymentReconciler } from './commerce/reconciliation.ts';
import { CommerceState } from './commerce/state.ts';
import { dateOf, systemClock, type Clock } from './domain/clock.ts';
import { sweepExpiredHolds } from './gateway/settle.ts';
import type { Config } from './config.ts';
import { MemoryRateLimiter, RedisRateLimiter, type RateLimiter } from './http/rate-limit.ts';
import { REDIS_CLIENT_OPTIONS } from './http/redis-breaker.ts';
import type { App } from './http/types.ts';
import { openStorage, type Storage } from './storage/db.ts';
import { purgeExpiredIdempotencyKeys } from './storage/idempotency.ts';
import { migrateToLatest } from './storage/migrate.ts';
import { WebhookDispatcher } from './webhooks/dispatcher.ts';
import { CallJournal } from './ledger/journal/journal.ts';
import { replayCallJournal, type ReplaySummary } from './ledger/journal/replay.ts';
import { createPaymentProvider } from './payments/index.ts';
import { presentCustomer } from './services/customers.ts';
import { startAlertRound } from './services/alert-round.ts';

export type RunningServer = {
  app: App;
  url: string;
  /** What the app and its background loops keep in process: one, shared (purchase turns, methods awaiting confirmation). */
  commerceState: CommerceState;
  stop(): Promise<void>;
};

const SWEEP_INTERVAL_MS = 30_000;
/** How often due subscriptions are looked for (each instance; a subscription is renewed once). */
const RENEWAL_INTERVAL_MS = 60_000;
/** How often payments and refunds left undecided are reconciled against the payment provider. */
const RECONCILE_INTERVAL_MS = 60_000;
/** How often alert rules are compared with balances and spend (decision 0043). */
const ALERT_INTERVAL_MS = 60_000;

/** config -> storage -> migrations -> buildApp() -> listen. */
export async function startServer(
  config: Config,
  opts: { sweepIntervalMs?: number; renewalIntervalMs?: number; clock?: Clock } = {},
): Promise<RunningServer> {
  const clock = opts.clock ?? systemClock;
  const heapGrowthLimited = limitHeapGrowth(config.heapGrowingPercent);
  // Money written by a batch the writer thread died under is written again member by member (the
  // writers' fallback); the death itself must be loud.
  let reportWriterDeath = (err: Error) => console.error(err);
  const storage = openStorage(config.databaseUrl, { onWriterDeath: (err) => reportWriterDeath(err), readUrl: config.databaseReadUrl });
  await migrateToLatest(storage);
  let reportOutage = (_err: unknown) => {};
  let reportRecovery = () => {};
  const { limiter, redis } = makeRateLimiter(
    config,
    (err) => reportOutage(err),
    () => reportRecovery(),
  );
  if (redis) await connectedWithin(redis, REDIS_START_WAIT_MS);
  const payments = createPaymentProvider(config);
  // Calls a killed process served but had not settled are settled from its journal first, with
  // the usage their relays ended with (decision 0024); the sweep below then finds nothing of theirs.
  const { journal, replayed } = await openCallJournal(config, storage, clock);
  // What a crash left behind is recovered before serving (decision 0019). An embedded database has
  // one serving process, so every hold still active is an orphan of the previous one; instances
  // sharing PostgreSQL recover only holds past their TTL (the others' requests may be in flight).
  await sweepExpiredHolds(storage, storage.dialect === 'sqlite' ? new Date('9999-12-31T23:59:59.999Z') : dateOf(clock));
  // The app's flows and the reconciliation below share it: a purchase's turn or a method awaiting
  // confirmation that one records, the other sees.
  const commerceState = new CommerceState();
  const app = await buildApp({ config, storage, rateLimiter: limiter, payments, clock, commerceState, ...(journal ? { journal } : {}) });
  if (replayed) app.log.info({ journal: config.callJournalDir, ...replayed }, 'calls left in the call journal by the previous process are settled');
  reportWriterDeath = (err) => app.log.error({ err }, 'the SQLite writer thread died; a new one takes over with the next write');
  reportOutage = (err) => app.log.warn({ err }, 'Redis is unreachable: rate limits are counted per instance until it is back');
  reportRecovery = () => app.log.info('Redis answers again: rate limits are counted in Redis');
  const url = await app.listen({ port: config.port, host: config.host });
  const sweeper = startSweeper(storage, app, clock, opts.sweepIntervalMs ?? SWEEP_INTERVAL_MS, config.walletLeaseTtlMs);
  const webhooks = startWebhookDispatcher(config, storage, app, clock);
  const renewals = startRenewalScheduler(
    { storage, payments, clock },
    { intervalMs: opts.renewalIntervalMs ?? RENEWAL_INTERVAL_MS, onError: (err, subscriptionId) => app.log.error({ err, subscriptionId }, 'subscription renewal failed') },
  );
  const reconciler = startPaymentReconciler(
    { storage, payments, clock, commerceState },
    {
      intervalMs: RECONCILE_INTERVAL_MS,
      customerEventData: (row) => presentCustomer(row, dateOf(clock)),
      onError: (err) => app.log.error({ err }, 'payment reconciliation failed'),
    },
  );
  const alerts = startAlertRound({ storage, clock }, { intervalMs: ALERT_INTERVAL_MS, onError: (err) => app.log.error({ err }, 'alert round failed') });
  app.log.info(
    { database: storage.describe, ...(storage.replica ? { reports: storage.replica.reads.describe } : {}), redis: Boolean(redis), heapGrowingPercent: heapGrowthLimited ? config.heapGrowingPercent : 'not set by Tollgate' },
    `Tollgate listening on ${url}`,
  );
  return {
    app,
    url,
    commerceState,
    stop: async () => {
      for (const timer of sweeper) clearInterval(timer);
      // Background work stops while the requests in flight finish, so the shutdown takes the
      // longest of their deadlines, not their sum (decision 0010).
      await Promise.all([webhooks.stop(), renewals.stop(), reconciler.stop(), alerts.stop(), app.close()]);
      // Every settlement is written (app.close drained them): the journal keeps nothing.
      journal?.close();
      await releaseConnections(storage, limiter, redis);
    },
  };
}

/**
 * The instance's call journal, after replaying what an earlier process left in it (decision 0024);
 * null when it is off.
 */
async function openCallJournal(config: Config, storage: Storage, clock: Clock): Promise<{ journal: CallJournal | null; replayed: ReplaySummary | null }> {
  if (config.callJournalDir === null) return { journal: null, replayed: null };
  const journal = new CallJournal(config.callJournalDir, { clock });
  if (journal.leftover.length === 0) return { journal, replayed: null };
  const replayed = await replayCallJournal(storage, journal.leftover, dateOf(clock));
  // Only once all of it is in the database: a replay cut short runs again at the next start.
  journal.discard(journal.leftover);
  return { journal, replayed };
}

/**
 * Under load most of what V8 promotes to its old generation is request garbage that merely outlived
 * two scavenges, and V8 lets that generation grow to several times what its last full collection
 * kept before collecting again: a gateway with ~35 MB live peaked at ~250 MB resident. A lower
 * growing factor collects sooner, for a few full collections a second (decision 0015). V8 reads
 * the factor at every collection, so setting it now still takes effect; a value the operator gave
 * node itself wins. Returns whether it set one.
 */
export function limitHeapGrowth(
  percent: number | null,
  nodeFlags: string[] = [...process.execArgv, ...(process.env.NODE_OPTIONS?.split(/\s+/) ?? [])],
): boolean {
  if (percent === null || nodeFlags.some((flag) => /^--heap[-_]growing[-_]percent\b/.test(flag))) return false;
  v8.setFlagsFromString(`--heap-growing-percent=${percent}`);
  return true;
}

/**
 * Periodic clean-up of what a crash or time leaves behind: holds whose settlement never came (their
 * records marked `error`), and idempotency keys past their 24 h or their lease, which would
 * otherwise only go when the same key came back.
 */
function startSweeper(storage: Storage, app: App, clock: Clock, intervalMs: number, leaseTtlMs: number): NodeJS.Timeout[] {
  // Holds are swept at least once per lease lifetime, so a dead instance's wallet leases return
  // within about two lifetimes even to POST /requests (decision 0019); the query is indexed.
  const holds = setInterval(() => {
    sweepExpiredHolds(storage, dateOf(clock)).catch((err: unknown) => app.log.error({ err }, 'hold sweep failed'));
  }, Math.min(intervalMs, leaseTtlMs));
  const keys = setInterval(() => {
    purgeExpiredIdempotencyKeys(storage.db, dateOf(clock).toISOString()).catch((err: unknown) =>
      app.log.error({ err }, 'idempotency key purge failed'),
    );
  }, intervalMs);
  holds.unref();
  keys.unref();
  return [holds, keys];
}

/** Every server process delivers webhooks; instances sharing a PostgreSQL database split the work. */
function startWebhookDispatcher(config: Config, storage: Storage, app: App, clock: Clock): WebhookDispatcher {
  const dispatcher = new WebhookDispatcher({
    storage,
    now: () => clock.now(),
    policy: { allowHttpLoopback: config.webhooks.allowHttpLoopback },
    timeoutMs: config.webhooks.timeoutMs,
    maxConcurrency: config.webhooks.maxConcurrency,
    retentionDays: config.webhooks.retentionDays,
    log: app.log.child({ component: 'webhooks' }),
    registry: app.metrics,
  });
  dispatcher.start();
  return dispatcher;
}

function makeRateLimiter(
  config: Config,
  onOutage: (err: unknown) => void,
  onRecovery: () => void,
): { limiter: RateLimiter; redis: Redis | null } {
  if (!config.redisUrl) return { limiter: new MemoryRateLimiter(), redis: null };
  // A command to a Redis that stopped answering fails fast, so the limiter can count locally.
  const redis = new Redis(config.redisUrl, REDIS_CLIENT_OPTIONS);
  // Connection errors are reported through onOutage; without a listener ioredis logs each retry.
  redis.on('error', () => {});
  return { limiter: new RedisRateLimiter(redis, { onOutage, onRecovery }), redis };
}

/**
 * How long a start waits for Redis to connect. Commands time out after a few milliseconds, and the
 * connection handshake would otherwise count against the first ones, opening the breaker (and
 * sending the first calls to the local fallback) for nothing on a slow start.
 */
const REDIS_START_WAIT_MS = 2_000;

/** Resolves once `redis` is connected, or after `ms` (a Redis that is down must not stop a start). */
async function connectedWithin(redis: Redis, ms: number): Promise<void> {
  if (redis.status === 'ready') return;
  await new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      redis.off('ready', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    timer.unref();
    redis.once('ready', done);
  });
}

/** Once nothing runs any more: the database, the rate limiter and Redis. */
async function releaseConnections(storage: Storage, limiter: RateLimiter, redis: Redis | null): Promise<void> {
  await limiter.close();
  await storage.close();
  // QUIT would wait in the offline queue for a Redis that is not there.
  if (redis?.status === 'ready') await redis.quit();
  else redis?.disconnect();
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
