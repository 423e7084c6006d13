import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Providers the shared mock (mock-upstream.ts) cannot play, for the relay tests: a tiny "raw"
 * provider that sends bytes the mock cannot (odd JSON whitespace, a cut or usage-less answer, a
 * large binary body, a flood only back-pressure slows) and reports when its socket closes, so a
 * client disconnect can be seen to abort the upstream call; a TCP server that never answers; and
 * a port that refuses connections.
 */

/** The 'raw-json' mode's answer, byte for byte: odd whitespace, escapes and an unknown field. */
export const RAW_JSON =
  '{"id":"chatcmpl-raw",\n\t"object" : "chat.completion",   "model":"mistral-small-latest","choices":[],' +
  '"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"x_unknown":{"deep":[1,  2.50, "\u00e9\\u00e9", null]}}\r\n';
/** The 'big' mode's answer: a little over 2 MiB of random bytes. */
export const BIG_BODY = randomBytes(2 * 1024 * 1024 + 17);
/** 40 characters of RAW_JSON: the part of a cut answer the gateway sees. */
export const CUT_JSON_SEEN = RAW_JSON.slice(0, 40);
/** A chat completion without usage: its text is "chat.completion" and "hello world again" (32 characters). */
export const NO_USAGE_JSON =
  '{"id":"chatcmpl-nousage","object":"chat.completion","model":"mistral-small-latest","choices":[{"index":0,"message":{"role":"assistant","content":"hello world again"}}]}';

export type RawProvider = {
  url: string;
  /** Per slow stream: when the socket closed, whether it closed before the stream ended, chunks written. */
  streams: { closedAt: number | null; closedEarly: boolean; written: number }[];
  /** Bytes the 'flood' mode managed to write so far. */
  flooded: () => number;
  close(): Promise<void>;
};

/** What the 'flood' mode offers at most: far more than every socket buffer on the way can hold. */
const FLOOD_BYTES = 256 * 1024 * 1024;

/** Answers by the x-test-mode request header (which, not being a credential, passes through). */
export async function startRawProvider(): Promise<RawProvider> {
  const streams: RawProvider['streams'] = [];
  let flooded = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    res.on('error', () => {});
    req.resume();
    req.on('end', () => void answer(req, res));
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });

  async function answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const mode = String(req.headers['x-test-mode'] ?? '');
    if (mode === 'raw-json') {
      res.writeHead(200, { 'content-type': 'application/json', 'x-provider-extra': 'kept' });
      res.end(RAW_JSON);
      return;
    }
    if (mode === 'cut-json') {
      // Declares the whole body, sends CUT_JSON_SEEN of it, then drops the connection.
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(RAW_JSON.length) });
      res.write(CUT_JSON_SEEN, () => res.socket?.destroy());
      return;
    }
    if (mode === 'no-usage') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(NO_USAGE_JSON);
      return;
    }
    if (mode === 'flood') {
      // As fast as it is allowed to: only back-pressure slows it down.
      const chunk = Buffer.alloc(65_536, 'x');
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      for (flooded = 0; flooded < FLOOD_BYTES && !res.destroyed; flooded += chunk.length) {
        if (!res.write(chunk)) await drainedOrClosed(res);
      }
      res.end();
      return;
    }
    if (mode === 'big') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      for (let offset = 0; offset < BIG_BODY.length; offset += 65_536) {
        if (!res.write(BIG_BODY.subarray(offset, offset + 65_536))) await new Promise((r) => res.once('drain', r));
      }
      res.end();
      return;
    }
    // A slow OpenAI-style stream: one word per chunk, never a usage chunk.
    const chunks = Number(req.headers['x-test-chunks'] ?? 100);
    const delay = Number(req.headers['x-test-delay'] ?? 30);
    const state = { closedAt: null as number | null, closedEarly: false, written: 0 };
    streams.push(state);
    res.on('close', () => {
      state.closedAt = Date.now();
      state.closedEarly = !res.writableEnded;
    });
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders();
    for (let i = 0; i < chunks; i++) {
      await sleep(delay); // Wall clock: a slow provider takes real time between its chunks.
      if (res.destroyed) return;
      const chunk = { id: 'chatcmpl-slow', object: 'chat.completion.chunk', model: 'mistral-small-latest', choices: [{ index: 0, delta: { content: 'word ' } }] };
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
      state.written += 1;
    }
    res.end('data: [DONE]\n\n');
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    streams,
    flooded: () => flooded,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Waits until the response can take more, or is gone; whichever comes first removes the other listener. */
function drainedOrClosed(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.once('drain', done);
    res.once('close', done);
  });
}

export type SilentServer = { port: number; connections: () => number; close(): Promise<void> };

/** A TCP server that accepts connections and never says a word: a TLS handshake with it never ends. */
export async function startSilentServer(): Promise<SilentServer> {
  const sockets = new Set<Socket>();
  let connections = 0;
  const server = createNetServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    connections: () => connections,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A loopback port nothing listens on: a connection to it is refused. */
export async function closedPort(): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
