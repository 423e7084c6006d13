import { Kysely, PostgresDialect, sql, type PostgresPool, type PostgresPoolClient } from 'kysely';
import type pg from 'pg';
import type { Database } from './schema.ts';
import type { Storage } from './db.ts';

/**
 * A streaming replica that report reads go to (DATABASE_READ_URL, decision 0041). Reads that
 * decide money, and every write, stay on the primary; the replica only ever sees reports.
 */
export type ReadReplica = {
  /** The handle reports read through: the replica, or the primary while the replica is down. */
  reads: Storage;
  /** Whether reports are going to the replica right now (false while it is found down). */
  serving(): boolean;
  /** How far the replica is behind the primary, measured now on both (`unreachable` if either fails). */
  lag(): Promise<ReplicaLag>;
  close(): Promise<void>;
};

/**
 * `streaming`: a server in recovery (a standby), `lagSeconds` since the last transaction it
 * replayed when it has not replayed everything the primary wrote (0 when it has), `lagBytes` of
 * WAL the primary wrote that it has not replayed yet. `primary`: DATABASE_READ_URL names a server
 * that is not in recovery (a promoted standby, or the primary itself), so its reads are its own
 * latest. `unreachable`: reports are read from the primary meanwhile.
 */
export type ReplicaLag =
  | { status: 'streaming'; lagSeconds: number; lagBytes: number }
  | { status: 'primary'; lagSeconds: 0; lagBytes: 0 }
  | { status: 'unreachable' };

type OpenPool = (url: string, max: number, pipeline: boolean, connectTimeoutMs?: number) => pg.Pool;

/**
 * A replica that refuses connections is known at once (ECONNREFUSED); one that does not answer
 * costs a report this long before it falls back to the primary, once: the replica is then skipped
 * until a probe reaches it again.
 */
const REPLICA_CONNECT_TIMEOUT_MS = 1_000;
/** While the replica is down, it is tried again this often (in the background). */
const REPLICA_PROBE_INTERVAL_MS = 1_000;

export function openReadReplica(
  url: string,
  opts: {
    primary: pg.Pool;
    primaryDb: Kysely<Database>;
    max: number;
    openPool: OpenPool;
    /** The URL as logs show it, without credentials (db.ts describePostgres). */
    describe: string;
  },
): ReadReplica {
  // The same session settings as the primary's connections (jit = off, decision 0033).
  const replicaPool = opts.openPool(url, opts.max, false, REPLICA_CONNECT_TIMEOUT_MS);
  const routing = new ReplicaOrPrimary(replicaPool, opts.primary);
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool: routing }) });
  // Lag is measured on the replica itself, never on the primary a report would fall back to. The
  // pool is the router's, which ends it.
  const replicaOnly = new Kysely<Database>({
    dialect: new PostgresDialect({ pool: { connect: () => replicaPool.connect(), end: async () => {} } }),
  });
  const reads: Storage = {
    db,
    dialect: 'postgres',
    describe: `${opts.describe} (read replica)`,
    // Closed with the storage that owns it (the primary's pool is not this handle's to end).
    close: async () => {},
  };
  return {
    reads,
    serving: () => !routing.down,
    // A lag that cannot be measured (the primary failing while asked for its WAL position too) is unknown.
    lag: () => measureLag(replicaOnly, opts.primaryDb).catch((): ReplicaLag => ({ status: 'unreachable' })),
    // Kysely ends a pool only if a query went through it, so the router's own pool is ended here
    // too: a replica no report ever read from must not keep its connections (or the process) alive.
    close: async () => {
      await replicaOnly.destroy();
      await db.destroy();
      await routing.end();
    },
  };
}

/**
 * The pool reports take connections from: the replica's while it answers, else the primary's.
 * A failed connect, or a replica connection that breaks, marks the replica down; a background
 * probe brings it back once it accepts a connection again. A statement already running on a
 * replica connection that breaks still fails (the request answers 503); the next one falls back.
 */
class ReplicaOrPrimary implements PostgresPool {
  down = false;
  private probe: NodeJS.Timeout | undefined;
  private ending: Promise<void> | undefined;

  constructor(
    private readonly replica: pg.Pool,
    private readonly primary: pg.Pool,
  ) {
    replica.on('error', () => this.markDown());
    replica.on('connect', (client) => client.on('error', () => this.markDown()));
  }

  async connect(): Promise<PostgresPoolClient> {
    if (!this.down) {
      try {
        return await this.replica.connect();
      } catch {
        this.markDown();
      }
    }
    return this.primary.connect();
  }

  /** Only the replica's pool is this router's: the primary's belongs to the storage. Ends it once, whoever asks first. */
  async end(): Promise<void> {
    this.stopProbing();
    this.ending ??= this.replica.end();
    await this.ending;
  }

  stopProbing(): void {
    clearTimeout(this.probe);
    this.probe = undefined;
  }

  private markDown(): void {
    this.down = true;
    if (this.probe === undefined) this.scheduleProbe();
  }

  private scheduleProbe(): void {
    this.probe = setTimeout(() => void this.tryReplica(), REPLICA_PROBE_INTERVAL_MS);
    // A probe never keeps the process alive on its own.
    this.probe.unref();
  }

  private async tryReplica(): Promise<void> {
    try {
      const client = await this.replica.connect();
      client.release();
      this.down = false;
      this.probe = undefined;
    } catch {
      this.scheduleProbe();
    }
  }
}

/** What the replica says of itself: whether it is a standby, how far it replayed, and how long ago. */
type StandbyState = { in_recovery: boolean; replayed: string | null; since_replay: number | null };

/**
 * Byte lag is the primary's current WAL position less the replica's replayed one. Time lag is
 * the age of the last replayed transaction, but only while the replica is behind: on a primary
 * with nothing to write, that age grows although the replica has everything.
 */
async function measureLag(replica: Kysely<Database>, primary: Kysely<Database>): Promise<ReplicaLag> {
  let standby: StandbyState | undefined;
  try {
    const { rows } = await sql<StandbyState>`
      select pg_is_in_recovery() as in_recovery,
             pg_last_wal_replay_lsn()::text as replayed,
             extract(epoch from now() - pg_last_xact_replay_timestamp())::float8 as since_replay`.execute(replica);
    standby = rows[0];
  } catch {
    return { status: 'unreachable' };
  }
  if (!standby?.in_recovery || standby.replayed === null) return { status: 'primary', lagSeconds: 0, lagBytes: 0 };
  const { rows } = await sql<{ behind: string }>`
    select greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), ${standby.replayed}::pg_lsn), 0)::bigint::text as behind`.execute(primary);
  const lagBytes = Number(rows[0]?.behind ?? 0);
  const lagSeconds = lagBytes === 0 ? 0 : Math.max(0, standby.since_replay ?? 0);
  return { status: 'streaming', lagSeconds, lagBytes };
}
