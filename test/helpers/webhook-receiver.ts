import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.ts';
import type { TestApp } from './app.ts';

export type Received = { headers: IncomingHttpHeaders; body: string; path: string };

/** What the receiver does with a request: answer a status, or take the response and do anything. */
export type Responder = (req: Received, res: ServerResponse, index: number) => number | 'handled';

export type Receiver = {
  url: string;
  received: Received[];
  /** Resolves once `count` requests have arrived (rejects after `timeoutMs`). */
  waitFor(count: number, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
};

/** A real HTTP server on loopback that records every request (raw body included) and answers as told. */
export async function startReceiver(respond: Responder = () => 200): Promise<Receiver> {
  const received: Received[] = [];
  const waiters: { count: number; resolve: () => void }[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const entry = { headers: req.headers, body: Buffer.concat(chunks).toString('utf8'), path: req.url ?? '/' };
      received.push(entry);
      for (const w of waiters.filter((w) => received.length >= w.count)) w.resolve();
      const answer = respond(entry, res, received.length - 1);
      if (answer !== 'handled') res.writeHead(answer, { 'content-type': 'text/plain' }).end('ok');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    received,
    waitFor: (count, timeoutMs = 5_000) =>
      new Promise<void>((resolve, reject) => {
        if (received.length >= count) return resolve();
        const timer = setTimeout(() => reject(new Error(`receiver got ${received.length} of ${count} deliveries in ${timeoutMs} ms`)), timeoutMs);
        waiters.push({ count, resolve: () => (clearTimeout(timer), resolve()) });
      }),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * A webhook dispatcher for a test app that delivers to a loopback receiver, on the app's test
 * clock; the test runs its rounds by hand (tick, drain) and stops it.
 */
export function loopbackDispatcher(t: TestApp): WebhookDispatcher {
  return new WebhookDispatcher({
    storage: t.storage,
    policy: { allowHttpLoopback: true },
    timeoutMs: 2_000,
    maxConcurrency: 4,
    log: t.app.log,
    now: () => t.clock.now(),
    random: () => 0.5,
  });
}
