import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { freshDatabase, type TestDatabase } from './databases.ts';

export type TcpProxy = {
  port: number;
  /** Makes the server unreachable: open connections are cut and new ones refused. */
  cut(): Promise<void>;
  /** Accepts again on the same port. */
  restore(): Promise<void>;
  close(): Promise<void>;
};

/** A loopback TCP proxy to `target`, for taking a server away from an app and giving it back. */
export async function startTcpProxy(target: { host: string; port: number }): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  let server: Server;
  const listen = (port: number) =>
    new Promise<number>((resolve, reject) => {
      server = createServer((client) => {
        const upstream = connect(target.port, target.host);
        for (const s of [client, upstream]) {
          sockets.add(s);
          s.on('close', () => sockets.delete(s));
          s.on('error', () => {
            client.destroy();
            upstream.destroy();
          });
        }
        client.pipe(upstream);
        upstream.pipe(client);
      });
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => resolve((server.address() as AddressInfo).port));
    });
  const stop = () =>
    new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    });
  const port = await listen(0);
  return {
    port,
    cut: stop,
    restore: async () => {
      await listen(port);
    },
    close: async () => {
      if (server.listening) await stop();
    },
  };
}

/**
 * A fresh PostgreSQL database reached through a TcpProxy, for taking the database away from an
 * app: `database` is what the app connects to, `terminateConnections` ends the app's backends
 * (found by their application_name) and returns how many it ended.
 */
export type DatabaseBehindProxy = {
  proxy: TcpProxy;
  database: TestDatabase;
  terminateConnections(): Promise<number>;
  close(): Promise<void>;
};

export async function databaseBehindProxy(applicationName: string): Promise<DatabaseBehindProxy> {
  const direct = await freshDatabase('postgres');
  const url = new URL(direct.url);
  const proxy = await startTcpProxy({ host: url.hostname, port: Number(url.port || 5432) });
  url.host = `127.0.0.1:${proxy.port}`;
  url.searchParams.set('application_name', applicationName);
  const admin = new pg.Client({ connectionString: direct.url });
  await admin.connect();
  return {
    proxy,
    database: { dialect: 'postgres', url: url.toString() },
    terminateConnections: async () =>
      (await admin.query('select pg_terminate_backend(pid) from pg_stat_activity where application_name = $1', [applicationName])).rowCount ?? 0,
    close: async () => {
      await proxy.close();
      await admin.end();
    },
  };
}
