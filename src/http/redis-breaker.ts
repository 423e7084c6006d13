import type { Redis } from 'ioredis';

/**
 * Redis faults cost a call a few milliseconds at most (decision 0025). Redis holds only shared
 * counters (rate-limit windows, spend keys' token buckets), each with a fallback that needs no
 * Redis, so a call never waits long for it:
 *  - every command fails after REDIS_COMMAND_TIMEOUT_MS (a frozen Redis keeps its TCP connection
 *    open, so only a timeout notices it);
 *  - after a failure the breaker opens: calls take their fallback at once, without a command, while
 *    a PING every REDIS_PROBE_INTERVAL_MS (never a caller's command) finds out when Redis answers
 *    again, which closes it.
 */
export const REDIS_COMMAND_TIMEOUT_MS = 50;
export const REDIS_PROBE_INTERVAL_MS = 500;

/** ioredis options every Tollgate client on the request path shares. */
export const REDIS_CLIENT_OPTIONS = { maxRetriesPerRequest: 2, commandTimeout: REDIS_COMMAND_TIMEOUT_MS } as const;

/** Thrown instead of sending a command while the breaker is open. */
export class RedisCircuitOpen extends Error {
  constructor() {
    super('Redis is not answering: its commands are skipped until a probe succeeds');
    this.name = 'RedisCircuitOpen';
  }
}

export type BreakerEvents = {
  /** The breaker opened: the first failure of an outage. */
  onOpen?: (err: unknown) => void;
  /** A probe was answered: calls use Redis again. */
  onClose?: () => void;
};

export class RedisBreaker {
  readonly #redis: Redis;
  readonly #events: BreakerEvents;
  readonly #probeIntervalMs: number;
  #probe: NodeJS.Timeout | null = null;
  #probing = false;

  constructor(redis: Redis, events: BreakerEvents = {}, probeIntervalMs = REDIS_PROBE_INTERVAL_MS) {
    this.#redis = redis;
    this.#events = events;
    this.#probeIntervalMs = probeIntervalMs;
  }

  /** Whether calls are skipping Redis right now. */
  get isOpen(): boolean {
    return this.#probe !== null;
  }

  /** Runs `command` against Redis, or throws RedisCircuitOpen at once while the breaker is open. */
  async run<T>(command: (redis: Redis) => Promise<T>): Promise<T> {
    if (this.#probe) throw new RedisCircuitOpen();
    try {
      return await command(this.#redis);
    } catch (err) {
      this.#open(err);
      throw err;
    }
  }

  /** Stops probing (the app is closing). */
  close(): void {
    if (this.#probe) clearInterval(this.#probe);
    this.#probe = null;
  }

  #open(err: unknown): void {
    if (this.#probe) return;
    this.#probe = setInterval(() => void this.#tryClosing(), this.#probeIntervalMs);
    this.#probe.unref();
    this.#events.onOpen?.(err);
  }

  async #tryClosing(): Promise<void> {
    // A probe still waiting (on a reconnect, say) is not joined by another.
    if (this.#probing || !this.#probe) return;
    this.#probing = true;
    try {
      await this.#redis.ping();
      if (this.#probe) {
        this.close();
        this.#events.onClose?.();
      }
    } catch {
      // Still out: the next tick probes again.
    } finally {
      this.#probing = false;
    }
  }
}
