import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { freshDatabase } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';
import { printFigures } from './harness.ts';

/**
 * Crash test: a real `tollgate serve` process on PostgreSQL is SIGKILLed while clients record usage
 * and forward provider calls, then restarted. Every POST /v1/requests that got no answer is retried
 * with its request_id: nothing is recorded or charged twice, every 2xx has exactly one record, the
 * ledger verifies and the customer's wallet equals its grant minus its records' charges.
 * Not asserted yet: forwarded calls answered 200 whose settlement the kill lost are not charged
 * (billing them by their hold's estimate is issue 18's finding 9); their number is printed as
 * served_but_uncharged, and the assertion that it is 0 belongs here once that lands.
 */

const postgres = process.env.TEST_DATABASE_URL;
const CLIENTS = 12;
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const { port } = server.address() as AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

describe.runIf(postgres)('crash test: SIGKILL mid-load on postgres', () => {
  let storage: Storage;
  let upstream: MockUpstream;
  let child: ChildProcess | undefined;
  let env: Record<string, string>;
  let base: string;
  let output = '';

  const start = async () => {
    child = spawn('node', ['bin/tollgate.js', 'serve'], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    for (let i = 0; i < 600; i++) {
      const ready = await fetch(`${base}/readyz`).then((r) => r.status === 200, () => false);
      if (ready) return;
      await pause(50);
    }
    throw new Error(`tollgate serve did not become ready:\n${output.slice(-2000)}`);
  };

  beforeAll(async () => {
    const database = await freshDatabase('postgres');
    storage = openStorage(database.url, { poolSize: 4 });
    await migrateToLatest(storage);
    upstream = await startMockUpstream();
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    env = {
      DATABASE_URL: database.url,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_MINUTE: '100000000',
      UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }),
      PROVIDER_KEYS: JSON.stringify({ openai: 'sk-managed-crash-suite' }),
    };
  });
  afterAll(async () => {
    child?.kill('SIGKILL');
    await upstream?.close();
    await storage?.close();
  });

  it('charges nothing twice across a SIGKILL and a restart', async () => {
    const { merchant, secretKey } = await createMerchant(storage, { name: 'Crash' });
    await start();
    const auth = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
    const json = async (path: string, body: unknown) => (await fetch(`${base}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) })).json();
    const customer = await json('/v1/customers', { name: 'Crash customer' });
    const meter = await json('/v1/meters', { name: 'm', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.01' }] });
    const GRANT = parseMoney('1000');
    await creditWallet(storage, customer.wallet.wallet_id, GRANT);
    await creditWallet(storage, merchant.wallet_id, parseMoney('1000'));
    const token = Buffer.from(JSON.stringify({ secret_key: secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug })).toString('base64');

    const answeredRecords = new Set<string>();
    const unanswered: string[] = [];
    const forwards = { ok: 0, failed: 0 };
    const forwardIds: string[] = [];
    let sequence = 0;
    let answers = 0;
    let stop = false;
    const client = async () => {
      while (!stop) {
        const n = sequence++;
        if (n % 2 === 0) {
          const requestId = `crash-${n}`;
          try {
            const res = await fetch(`${base}/v1/requests`, { method: 'POST', headers: auth, body: JSON.stringify({ request_id: requestId, customer_id: customer.customer_id, meter_slug: meter.meter_slug }) });
            await res.arrayBuffer();
            if (res.status === 201) answeredRecords.add(requestId);
            else unanswered.push(requestId);
          } catch {
            unanswered.push(requestId);
          }
        } else {
          try {
            const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
              method: 'POST',
              headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
              body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: `n ${n}` }], max_tokens: 5 }),
            });
            await res.arrayBuffer();
            if (res.status === 200) {
              forwards.ok++;
              forwardIds.push(res.headers.get('x-tollgate-request-id')!);
            } else forwards.failed++;
          } catch {
            forwards.failed++;
          }
        }
        answers++;
      }
    };
    const clients = Array.from({ length: CLIENTS }, client);
    while (answers < 300) await pause(10);
    child!.kill('SIGKILL');
    await new Promise((r) => child!.once('exit', r));
    stop = true;
    await Promise.all(clients);

    await start();
    // The clients retry what got no answer, with the same request_id.
    let retried = 0;
    for (const requestId of unanswered) {
      const res = await fetch(`${base}/v1/requests`, { method: 'POST', headers: auth, body: JSON.stringify({ request_id: requestId, customer_id: customer.customer_id, meter_slug: meter.meter_slug }) });
      await res.arrayBuffer();
      expect([200, 201]).toContain(res.status);
      answeredRecords.add(requestId);
      retried++;
    }
    child!.kill('SIGTERM');
    await new Promise((r) => child!.once('exit', r));
    child = undefined;

    const records = await storage.db.selectFrom('requests').select(['id', 'request_id', 'status', 'total_wallet_cost', 'connection_id']).where('merchant_id', '=', merchant.id).execute();
    const perRequestId = new Map<string, number>();
    for (const r of records) perRequestId.set(r.request_id, (perRequestId.get(r.request_id) ?? 0) + 1);
    const duplicated = [...perRequestId.values()].filter((c) => c > 1).length;
    const missing = [...answeredRecords].filter((id) => perRequestId.get(id) !== 1).length;
    const byId = new Map(records.map((r) => [r.id, r.status]));
    const forwardsUnrecorded = forwardIds.filter((id) => byId.get(id) !== 'completed').length;
    const pending = records.filter((r) => r.status === 'pending').length;
    const charged = records.filter((r) => r.status === 'completed' && r.connection_id === customer.customer_id).reduce((s, r) => s + BigInt(r.total_wallet_cost), 0n);
    const wallet = await storage.db.selectFrom('wallets').select(['balance', 'held']).where('id', '=', customer.wallet.wallet_id).executeTakeFirstOrThrow();
    const ledger = await verifyLedger(storage);
    // Holds of calls in flight at the kill may still be reserved (until their TTL): the balance is what counts.
    const balanceMatches = BigInt(wallet.balance) === GRANT - charged;
    const discrepancies = duplicated + missing + ledger.problems.length + (balanceMatches ? 0 : 1);
    printFigures('crash', {
      requests: answers,
      kills: 1,
      retried_after_restart: retried,
      records: records.length,
      duplicated,
      missing_for_2xx: missing,
      forwards_ok: forwards.ok,
      forwards_failed_at_kill: forwards.failed,
      served_but_uncharged: forwardsUnrecorded,
      pending_after_restart: pending,
      ledger_problems: ledger.problems.length,
      discrepancies,
    });
    expect(output).not.toMatch(/sk_live_[A-Za-z0-9_-]{8,}|sk-managed-crash-suite/);
    expect(duplicated).toBe(0);
    expect(missing).toBe(0);
    expect(ledger.problems).toEqual([]);
    expect(balanceMatches).toBe(true);
    expect(discrepancies).toBe(0);
  });
});
