/**
 * Revocation across instances (decision 0019): with Redis configured, every instance publishes on
 * one channel when it changes a credential (a secret or spend key revoked or rotated, a customer,
 * meter or merchant changed), and every instance empties its credential cache when it hears one.
 * A change then reaches the other instances' gateway caches in the time of one Redis message
 * instead of the cache's 2 s entry lifetime (which remains the bound without Redis, or while Redis
 * is unreachable).
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import type { KyselyPlugin, PluginTransformQueryArgs, PluginTransformResultArgs, QueryResult, RootOperationNode, UnknownRow } from 'kysely';
import type { FastifyBaseLogger } from 'fastify';
import type { Storage } from '../storage/db.ts';
import { changesCredentials, type CredentialCache } from './credential-cache.ts';

const CREDENTIAL_CHANNEL = 'tollgate:credentials-changed';

export type CredentialBroadcast = { close(): Promise<void> };

export function broadcastCredentialChanges(storage: Storage, cache: CredentialCache, redisUrl: string, log: FastifyBaseLogger): CredentialBroadcast {
  const instance = randomUUID();
  // A change is never held back for Redis: publishing fails fast, and the 2 s bound still holds.
  const publisher = new Redis(redisUrl, { maxRetriesPerRequest: 1, commandTimeout: 1_000, enableOfflineQueue: false });
  // The subscription waits for the connection (and ioredis renews it after a reconnect).
  const subscriber = new Redis(redisUrl, { maxRetriesPerRequest: null });
  // Connection errors: the cache's own lifetime bounds staleness meanwhile; ioredis reconnects.
  publisher.on('error', () => {});
  subscriber.on('error', () => {});
  subscriber.subscribe(CREDENTIAL_CHANNEL).catch((err: unknown) => log.warn({ err }, 'credential change channel unavailable'));
  subscriber.on('message', (_channel: string, from: string) => {
    if (from !== instance) cache.invalidate();
  });
  storage.db = storage.db.withPlugin(new ChangePublisher(() => void publisher.publish(CREDENTIAL_CHANNEL, instance).catch(() => undefined)));
  return {
    close: async () => {
      subscriber.disconnect();
      publisher.disconnect();
    },
  };
}

/** Publishes once a statement that changes a credential has run (the cache's own rule of what counts). */
class ChangePublisher implements KyselyPlugin {
  readonly #publish: () => void;
  readonly #changes = new WeakSet<object>();

  constructor(publish: () => void) {
    this.#publish = publish;
  }

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    if (changesCredentials(args.node)) this.#changes.add(args.queryId);
    return args.node;
  }

  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    if (this.#changes.has(args.queryId)) this.#publish();
    return args.result;
  }
}
