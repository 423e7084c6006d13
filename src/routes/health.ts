import { sql } from 'kysely';
import { Gauge, type Registry } from 'prom-client';
import { z } from 'zod';
import { databaseUnavailable } from '../http/error-handler.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import type { ReadReplica, ReplicaLag } from '../storage/read-replica.ts';

const healthResponse = z.object({ status: z.literal('ok') });
const replicaState = z.object({
  status: z.enum(['streaming', 'primary', 'unreachable']).describe(
    '`streaming`: reports read from the standby; `primary`: DATABASE_READ_URL names a server not in recovery; `unreachable`: reports read from the primary meanwhile.',
  ),
  lag_seconds: z.number().optional().describe('Age of the last transaction the replica replayed, while it is behind the primary (0 when it is not).'),
  lag_bytes: z.number().int().optional().describe('WAL the primary has written that the replica has not replayed.'),
});
const readyResponse = z.object({
  status: z.enum(['ready', 'degraded']),
  database: z.enum(['sqlite', 'postgres']),
  redis: z.enum(['ready', 'unreachable']).optional(),
  replica: replicaState.optional().describe('Only with DATABASE_READ_URL: the read replica that usage reports and request lists read from.'),
});

export function registerHealthRoutes(app: App, deps: AppDeps): void {
  // Liveness: the process answers. It must not depend on the database.
  app.get(
    '/healthz',
    { config: { public: true }, schema: { tags: ['operations'], security: [], response: { 200: healthResponse } } },
    async () => ({ status: 'ok' as const }),
  );

  const replica = deps.storage.replica;
  if (replica) registerReplicaMetrics(app.metrics, replica);

  // Readiness: the database answers a query (else 503). With REDIS_URL, Redis is checked too, but
  // its loss only degrades the instance (rate limits counted locally): every instance shares that
  // Redis, and failing readiness would take all of them out of service at once. A read replica's
  // loss degrades it for the same reason: reports are read from the primary meanwhile.
  app.get(
    '/readyz',
    { config: { public: true }, schema: { tags: ['operations'], security: [], response: { 200: readyResponse } } },
    async () => {
      try {
        await sql`select 1`.execute(deps.storage.db);
      } catch {
        throw databaseUnavailable();
      }
      const database = deps.storage.dialect;
      // Redis and the replica are asked at once: a frozen one costs its own timeout, not the sum.
      const [redis, lag] = await Promise.all([
        deps.config.redisUrl ? deps.rateLimiter.reachable().then((up) => (up ? ('ready' as const) : ('unreachable' as const))) : undefined,
        replica?.lag(),
      ]);
      const degraded = redis === 'unreachable' || lag?.status === 'unreachable';
      return {
        status: degraded ? ('degraded' as const) : ('ready' as const),
        database,
        ...(redis ? { redis } : {}),
        ...(lag ? { replica: presentLag(lag) } : {}),
      };
    },
  );
}

function presentLag(lag: ReplicaLag): z.infer<typeof replicaState> {
  if (lag.status === 'unreachable') return { status: lag.status };
  return { status: lag.status, lag_seconds: lag.lagSeconds, lag_bytes: lag.lagBytes };
}

/** Measured when scraped: how far the replica is behind, and whether reports read from it. */
function registerReplicaMetrics(registry: Registry, replica: ReadReplica): void {
  // The gauges of one scrape are collected together and share one measurement.
  let measuring: Promise<ReplicaLag> | undefined;
  const measure = () =>
    (measuring ??= replica.lag().finally(() => {
      measuring = undefined;
    }));
  // An unreachable replica's lag is unknown: its gauges say NaN rather than an old value.
  const gauge = (name: string, help: string, valueOf: (lag: ReplicaLag) => number) =>
    new Gauge({
      name,
      help,
      registers: [registry],
      async collect() {
        this.set(valueOf(await measure()));
      },
    });
  gauge('tollgate_replica_lag_seconds', 'Age of the last transaction the read replica replayed, while it is behind the primary', (lag) =>
    lag.status === 'unreachable' ? Number.NaN : lag.lagSeconds,
  );
  gauge('tollgate_replica_lag_bytes', 'WAL the primary has written that the read replica has not replayed', (lag) =>
    lag.status === 'unreachable' ? Number.NaN : lag.lagBytes,
  );
  gauge('tollgate_replica_up', '1 while reports read from the read replica, 0 while they fall back to the primary', (lag) =>
    lag.status !== 'unreachable' && replica.serving() ? 1 : 0,
  );
}
