import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { afterAll, beforeAll } from 'vitest';
import { BUILTIN_PROVIDERS } from '../../src/providers/builtin.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { startGatewayOnMock, type MockGateway } from '../helpers/gateway.ts';
import { freshDatabase, type TestDatabase } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

/**
 * Shared parts of the reliability suite (`npm run test:reliability`): apps whose every log line
 * is kept (the security part checks the whole suite's logs for secrets), every provider host
 * mapped to the local mock upstream (no input, however random, reaches a real provider), and the
 * figures each part prints.
 */

/** Every log line every app of this file wrote. */
const logChunks: string[] = [];

export function suiteLogText(): string {
  return logChunks.join('');
}

function logStream(): Writable {
  return new Writable({
    write(chunk, _encoding, done) {
      logChunks.push(String(chunk));
      done();
    },
  });
}

/** Every host a built-in provider module serves: all of them lead to the mock. */
export const ALL_PROVIDER_HOSTS = [...new Set(BUILTIN_PROVIDERS.flatMap((p) => p.hosts))];

/** A listening app on a mock upstream, logging at info into the suite's log, with a high rate limit. */
export async function startSuiteGateway(
  dialect: TestDatabase['dialect'],
  opts: { env?: Record<string, string>; database?: TestDatabase } = {},
): Promise<MockGateway> {
  return startGatewayOnMock(dialect, {
    ...(opts.database ? { database: opts.database } : {}),
    providerHosts: ALL_PROVIDER_HOSTS,
    providerKeys: { openai: 'sk-managed-openai-suite', anthropic: 'sk-ant-managed-suite' },
    env: { LOG_LEVEL: 'info', RATE_LIMIT_PER_MINUTE: '100000000', ...opts.env },
    logStream: logStream(),
  });
}

/** Prints one part's figures on one line, so CI output shows what was proven. */
export function printFigures(part: string, figures: Record<string, number | string>): void {
  const text = Object.entries(figures)
    .map(([name, value]) => `${name}=${value}`)
    .join(' ');
  process.stdout.write(`[reliability] ${part}: ${text}\n`);
}

/** Credentials and personal data by shape: none may appear in any log line of the suite. */
const LEAK_SHAPES: readonly [string, RegExp][] = [
  ['secret key', /sk_live_[A-Za-z0-9_-]{8,}/],
  ['spend key', /spk_live_[A-Za-z0-9_-]{8,}/],
  ['wallet key', /wk_live_[A-Za-z0-9_-]{8,}/],
  ['webhook secret', /whsec_[A-Za-z0-9_-]{8,}/],
  ['managed provider key', /sk-managed-openai-suite|sk-ant-managed-suite/],
  ['e-mail address', /[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}/],
];

/** The log lines of this part that show a credential or an e-mail address (there must be none). */
export function leaksInSuiteLogs(extraSecrets: readonly string[] = []): { lines: number; leaks: string[] } {
  const lines = suiteLogText().split('\n').filter((l) => l.trim() !== '');
  const leaks: string[] = [];
  for (const line of lines) {
    for (const [what, shape] of LEAK_SHAPES) if (shape.test(line)) leaks.push(`${what}: ${line.slice(0, 200)}`);
    for (const secret of extraSecrets) if (line.includes(secret)) leaks.push(`a secret of the test: ${line.slice(0, 200)}`);
  }
  return { lines: lines.length, leaks };
}

/** A loopback port nothing listens on (for a `tollgate serve` process to take). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const { port } = server.address() as AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

/** A real `tollgate serve` process, with what it printed so far and its exit. */
export type ServeProcess = { child: ChildProcess; output: () => string; exited: Promise<number | null> };

/** Starts `tollgate serve` with `env` (PORT and HOST among it) and waits until `base`/readyz answers 200. */
export async function startServe(env: Record<string, string>, base: string): Promise<ServeProcess> {
  const child = spawn('node', ['bin/tollgate.js', 'serve'], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    await until(
      async () => {
        if (child.exitCode !== null) throw new Error(`it exited with ${child.exitCode}`);
        return fetch(`${base}/readyz`).then((r) => r.status === 200, () => false);
      },
      '`tollgate serve` to answer /readyz with 200',
      { timeoutMs: 30_000, intervalMs: 50 },
    );
    return { child, output: () => output, exited };
  } catch (error) {
    child.kill('SIGKILL');
    throw new Error(`tollgate serve did not become ready (${(error as Error).message}):\n${output.slice(-2000)}`);
  }
}

/** What a suite of `tollgate serve` processes shares: its database (open here too), its mock OpenAI and its port. */
export type ServeSuite = { storage: Storage; upstream: MockUpstream; base: string; env: Record<string, string>; serve?: ServeProcess };

/**
 * A fresh, migrated database of `dialect`, a mock upstream standing in for OpenAI (its managed key
 * `managedKey`) and a free port, made before the describe block's tests (beforeAll) for the
 * `tollgate serve` processes they start with `env` (`extraEnv` added to it); a process left in
 * `serve` is killed after them, and everything closed.
 */
export function useServeSuite(dialect: TestDatabase['dialect'], managedKey: string, extraEnv: Record<string, string> = {}): ServeSuite {
  const suite = {} as ServeSuite;
  beforeAll(async () => {
    const database = await freshDatabase(dialect);
    suite.storage = openStorage(database.url, { poolSize: 4 });
    await migrateToLatest(suite.storage);
    suite.upstream = await startMockUpstream();
    const port = await freePort();
    suite.base = `http://127.0.0.1:${port}`;
    suite.env = {
      DATABASE_URL: database.url,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_MINUTE: '100000000',
      UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': suite.upstream.url }),
      PROVIDER_KEYS: JSON.stringify({ openai: managedKey }),
      ...extraEnv,
    };
  });
  afterAll(async () => {
    suite.serve?.child.kill('SIGKILL');
    await suite.upstream?.close();
    await suite.storage?.close();
  });
  return suite;
}

/** The references a merchant's ledger charged more than once (a request charged twice): none, in every part. */
export async function referencesChargedTwice(storage: Storage, merchantId: string): Promise<{ reference: string | null }[]> {
  return storage.db
    .selectFrom('ledger_transactions')
    .select('reference')
    .where('merchant_id', '=', merchantId)
    .where('kind', '=', 'request_charge')
    .groupBy('reference')
    .having((eb) => eb.fn.countAll(), '>', 1)
    .execute();
}
