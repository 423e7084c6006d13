import { execFile, execFileSync } from 'node:child_process';
import { chownSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/**
 * A throwaway PostgreSQL primary and its streaming replica (pg_basebackup -R), each its own
 * cluster on a free loopback port, in one temp directory (removed by `destroy`, or with the test
 * run's temp directories): the shared server is left alone.
 * initdb refuses to run as root, so as root (CI) the clusters are made and run by the `postgres`
 * OS user.
 */
export type ReplicaCluster = {
  primaryUrl: string;
  replicaUrl: string;
  /** Stops the replica (fast shutdown: its sessions are ended). */
  stopReplica(): Promise<void>;
  startReplica(): Promise<void>;
  /** Stops both clusters and removes their directory. */
  destroy(): Promise<void>;
};

/** The newest installed server's binaries (Debian keeps each major version in its own folder). */
function binDir(): string {
  const versions = readdirSync('/usr/lib/postgresql')
    .filter((v) => /^\d+$/.test(v))
    .sort((a, b) => Number(b) - Number(a));
  if (versions.length === 0) throw new Error('no PostgreSQL server binaries under /usr/lib/postgresql');
  return `/usr/lib/postgresql/${versions[0]}/bin`;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

const asRoot = process.getuid?.() === 0;

/** Runs a server binary, as the postgres OS user when this process is root. */
async function pgTool(tool: string, args: string[]): Promise<void> {
  const [cmd, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', join(binDir(), tool), ...args]] : [join(binDir(), tool), args];
  await run(cmd, argv, { env: { ...process.env, PGCONNECT_TIMEOUT: '5' } });
}

function pgToolSync(tool: string, args: string[]): void {
  const [cmd, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', join(binDir(), tool), ...args]] : [join(binDir(), tool), args];
  execFileSync(cmd, argv, { stdio: 'ignore' });
}

/** Settings that make a small, quick, throwaway cluster; the socket lives in the temp directory. */
function serverOptions(port: number, dir: string): string {
  return [`-p ${port}`, `-k ${dir}`, "-c listen_addresses='127.0.0.1'", '-c fsync=off', '-c full_page_writes=off', '-c shared_buffers=16MB', '-c max_connections=40'].join(' ');
}

/** A throwaway primary alone, for tests that need server settings of their own (extensions, logging). */
/**
 * initdb, a base backup and two server starts take 3–5 s on a quiet host and several times that
 * on a loaded one (the whole suite in parallel): a hook that starts clusters may take this long.
 */
export const CLUSTER_START_TIMEOUT_MS = 180_000;

export type PostgresCluster = { url: string; destroy(): Promise<void> };

export async function startPostgresCluster(settings: string[] = []): Promise<PostgresCluster> {
  const cluster = await startClusters({ replica: false, settings });
  return { url: cluster.primaryUrl, destroy: cluster.destroy };
}

export function startReplicaCluster(): Promise<ReplicaCluster> {
  return startClusters({ replica: true, settings: [] });
}

async function startClusters(opts: { replica: boolean; settings: string[] }): Promise<ReplicaCluster> {
  const dir = mkdtempSync(join(tmpdir(), `tollgate-test-${process.env.TOLLGATE_TEST_RUN ?? 'adhoc'}-pg-`));
  if (asRoot) chownSync(dir, ...idsOf('postgres'));
  const primaryDir = join(dir, 'primary');
  const replicaDir = join(dir, 'replica');
  const [primaryPort, replicaPort] = [await freePort(), await freePort()];
  const started: string[] = [];
  const start = async (dataDir: string, port: number, log: string) => {
    const options = [serverOptions(port, dir), ...opts.settings.map((s) => `-c ${s}`)].join(' ');
    await pgTool('pg_ctl', ['-D', dataDir, '-l', join(dir, log), '-o', options, '-w', '-t', '120', 'start']);
    if (!started.includes(dataDir)) started.push(dataDir);
  };
  const stop = (dataDir: string) => pgTool('pg_ctl', ['-D', dataDir, '-m', 'fast', '-w', 'stop']);
  // A test process that ends without its afterAll (a crash, an unhandled error) still stops its
  // servers: they would otherwise outlive it, their directory gone.
  const stopAtExit = () => {
    for (const dataDir of started) {
      try {
        pgToolSync('pg_ctl', ['-D', dataDir, '-m', 'immediate', 'stop']);
      } catch {
        // Already stopped.
      }
    }
  };
  process.once('exit', stopAtExit);
  const destroy = async () => {
    process.off('exit', stopAtExit);
    for (const dataDir of started) await stop(dataDir).catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    // initdb's default pg_hba.conf already trusts replication connections from loopback, and its
    // default wal_level (replica) and max_wal_senders (10) allow a streaming standby.
    await pgTool('initdb', ['-D', primaryDir, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--no-sync', '--no-instructions']);
    await start(primaryDir, primaryPort, 'primary.log');
    if (opts.replica) {
      await pgTool('pg_basebackup', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', replicaDir, '-R', '-X', 'stream', '--no-sync']);
      await start(replicaDir, replicaPort, 'replica.log');
    }
  } catch (e) {
    await destroy();
    throw e;
  }
  return {
    primaryUrl: `postgres://postgres@127.0.0.1:${primaryPort}/postgres`,
    replicaUrl: `postgres://postgres@127.0.0.1:${replicaPort}/postgres`,
    stopReplica: () => stop(replicaDir),
    startReplica: () => start(replicaDir, replicaPort, 'replica.log'),
    destroy,
  };
}

/** The uid and gid of an OS user, from /etc/passwd. */
function idsOf(user: string): [number, number] {
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${user}:`));
  if (!line) throw new Error(`no ${user} user: as root, the throwaway clusters run as ${user}`);
  const [, , uid, gid] = line.split(':');
  return [Number(uid), Number(gid)];
}
