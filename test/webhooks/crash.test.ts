import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStorage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { freshDatabase, type TestDatabase } from '../helpers/databases.ts';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.ts';
import { until } from '../helpers/until.ts';

/** Starts `tollgate serve` as its own process and resolves with its base URL once it listens. */
function serve(databaseUrl: string): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn('node', ['bin/tollgate.js', 'serve'], {
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: '0', LOG_LEVEL: 'info', WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true', WEBHOOK_TIMEOUT_MS: '1000' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`server did not start: ${out}`)), 20_000);
    child.stdout!.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      const match = /listening on (http:\/\/[^"\s]+)/.exec(out);
      if (match) {
        clearTimeout(timer);
        resolve({ child, url: match[1]! });
      }
    });
    child.on('exit', (code) => reject(new Error(`server exited with ${code}: ${out}`)));
  });
}

describe('a server killed with deliveries due', () => {
  let database: TestDatabase;
  let receiver: Receiver;
  const children: ChildProcess[] = [];
  beforeAll(async () => {
    database = await freshDatabase('sqlite');
    // Each delivery is answered after 300 ms, so most are still waiting when the server dies.
    receiver = await startReceiver((_req, res) => {
      setTimeout(() => res.writeHead(200).end('ok'), 300).unref();
      return 'handled';
    });
  });
  afterAll(async () => {
    for (const c of children) c.kill('SIGKILL');
    await receiver?.close();
  });

  it('delivers every event at least once after SIGKILL and a restart', async () => {
    const storage = openStorage(database.url);
    await migrateToLatest(storage);
    const { secretKey } = await createMerchant(storage, { name: 'Crash' }, new Date().toISOString());
    await storage.close();

    const first = await serve(database.url);
    children.push(first.child);
    const call = (base: string, path: string, body: object) =>
      fetch(`${base}/v1/${path}`, { method: 'POST', headers: { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    expect((await call(first.url, 'webhooks', { name: 'r', url: receiver.url })).status).toBe(201);
    const customers = 20;
    for (let i = 0; i < customers; i++) await call(first.url, 'customers', {});
    await receiver.waitFor(2, 10_000);
    first.child.kill('SIGKILL');
    await new Promise((resolve) => first.child.once('exit', resolve));
    const beforeRestart = new Set(receiver.received.map((r) => JSON.parse(r.body).id)).size;
    expect(beforeRestart).toBeLessThan(customers);

    const second = await serve(database.url);
    children.push(second.child);
    const ids = () => new Set(receiver.received.map((r) => JSON.parse(r.body).id as string));
    // Not failing here: the assertions below say which deliveries are missing.
    await until(() => ids().size >= customers, 'every customer.created delivered', { timeoutMs: 15_000, intervalMs: 50 }).catch(() => undefined);
    second.child.kill('SIGTERM');

    const check = openStorage(database.url);
    const events = await check.db.selectFrom('events').select('id').where('type', '=', 'customer.created').execute();
    await check.close();
    expect(events).toHaveLength(customers);
    expect([...ids()].sort()).toEqual(events.map((e) => e.id).sort());
  });
});
