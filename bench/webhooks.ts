/**
 * Webhook delivery against a real server process: a local receiver (this process) answers 200,
 * events are committed straight into the outbox by this process, and each one's commit time is
 * compared with when the receiver got it (same clock).
 *   1. Throughput: a burst of events, timed until every delivery arrived.
 *   2. Lag at a rate: events committed at half the measured throughput, end-to-end lag p50/p99.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Storage } from '../src/storage/db.ts';
import { createMerchant } from '../src/storage/merchants.ts';
import { enqueueEvents } from '../src/webhooks/outbox.ts';

type Row = { scenario: string; engine: string; result: string; target: string };

const WEBHOOKS = 3;

export async function benchWebhooks(opts: { engine: string; storage: Storage; serverUrl: string; burst: number; rateSeconds: number }): Promise<Row[]> {
  const arrivals = new Map<string, number[]>();
  let received = 0;
  let waiting: { count: number; resolve: () => void } | null = null;
  const receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const at = performance.now();
      const { id } = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id: string };
      arrivals.set(id, [...(arrivals.get(id) ?? []), at]);
      received++;
      res.writeHead(200).end();
      if (waiting && received >= waiting.count) waiting.resolve();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  const until = (count: number) =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`webhook bench: ${received} of ${count} deliveries arrived`)), 120_000);
      waiting = { count, resolve: () => (clearTimeout(timer), resolve()) };
      if (received >= count) waiting.resolve();
    });

  try {
    const { merchant, secretKey } = await createMerchant(opts.storage, { name: 'Webhook bench' }, new Date().toISOString());
    for (let i = 0; i < WEBHOOKS; i++) {
      const res = await fetch(`${opts.serverUrl}/v1/webhooks`, {
        method: 'POST',
        headers: { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ name: `bench ${i}`, url: `${receiverUrl}/${i}` }),
      });
      if (!res.ok) throw new Error(`webhook bench: creating a webhook failed: ${await res.text()}`);
    }
    const commit = async (count: number): Promise<Map<string, number>> => {
      const at = new Date().toISOString();
      const ids = await opts.storage.db.transaction().execute((trx) =>
        enqueueEvents(trx, Array.from({ length: count }, (_, n) => ({ merchantId: merchant.id, type: 'customer.created' as const, data: { n }, at }))),
      );
      const committed = performance.now();
      return new Map(ids.map((id) => [id, committed]));
    };

    // 1. Throughput of a burst.
    const started = performance.now();
    await commit(opts.burst);
    await until(opts.burst * WEBHOOKS);
    const seconds = (performance.now() - started) / 1000;
    const eventsPerSecond = opts.burst / seconds;

    // 2. Lag at half that rate, events committed one by one.
    const rate = Math.max(1, Math.floor(eventsPerSecond / 2));
    const committedAt = new Map<string, number>();
    const total = Math.max(1, Math.floor(rate * opts.rateSeconds));
    const base = received;
    const t0 = performance.now();
    for (let n = 0; n < total; n++) {
      const due = t0 + (n * 1000) / rate;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      for (const [id, at] of await commit(1)) committedAt.set(id, at);
    }
    await until(base + total * WEBHOOKS);
    const lags = [...committedAt].flatMap(([id, at]) => (arrivals.get(id) ?? []).map((arrived) => arrived - at)).sort((a, b) => a - b);
    const pct = (q: number) => lags[Math.min(lags.length - 1, Math.ceil(q * lags.length) - 1)]!.toFixed(1);
    const duplicates = [...arrivals.values()].filter((a) => a.length > WEBHOOKS).length;
    console.log(`webhooks: ${eventsPerSecond.toFixed(0)} events/s (${(eventsPerSecond * WEBHOOKS).toFixed(0)} deliveries/s); lag at ${rate}/s p50 ${pct(0.5)} ms, p99 ${pct(0.99)} ms`);
    return [
      {
        scenario: `webhook delivery, burst of ${opts.burst} events to ${WEBHOOKS} local endpoints`,
        engine: opts.engine,
        result: `${eventsPerSecond.toFixed(0)} events/s (${(eventsPerSecond * WEBHOOKS).toFixed(0)} deliveries/s)`,
        target: '—',
      },
      {
        scenario: `webhook end-to-end lag (commit → receiver) at ${rate} events/s for ${opts.rateSeconds} s`,
        engine: opts.engine,
        result: `p50 ${pct(0.5)} ms, p99 ${pct(0.99)} ms (${lags.length} deliveries; ${duplicates} events delivered twice)`,
        target: '—',
      },
    ];
  } finally {
    receiver.closeAllConnections();
    await new Promise((resolve) => receiver.close(resolve));
  }
}
