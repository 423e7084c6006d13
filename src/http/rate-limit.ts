import type { Redis } from 'ioredis';
import { RedisBreaker } from './redis-breaker.ts';

export type RateDecision = {
  allowed: boolean;
  limit: number;
  remaining: number;
  /** Unix seconds when the current window ends. */
  resetAt: number;
};

/**
 * Fixed one-minute windows per API key. The in-process limiter serves the embedded shape;
 * with REDIS_URL the count lives in Redis so every instance draws from the same window.
 */
export interface RateLimiter {
  /** Counts one request at `now` (ms since the epoch, from the app's clock). */
  hit(key: string, limit: number, windowMs: number, now: number): Promise<RateDecision>;
  /** How many hits `key` has had in the window that holds `now`, without counting one. */
  count(key: string, windowMs: number, now: number): Promise<number>;
  /** Forgets the hits of the window holding `now` (e.g. a sign-in's failures once one succeeds). */
  clear(key: string, windowMs: number, now: number): Promise<void>;
  /** Whether the shared store (if any) answers right now; always true in process. */
  reachable(): Promise<boolean>;
  close(): Promise<void>;
}

function windowOf(now: number, windowMs: number): { start: number; resetAt: number } {
  const start = Math.floor(now / windowMs) * windowMs;
  return { start, resetAt: Math.ceil((start + windowMs) / 1000) };
}

function decide(count: number, limit: number, resetAt: number): RateDecision {
  return { allowed: count <= limit, limit, remaining: Math.max(0, limit - count), resetAt };
}

export class MemoryRateLimiter implements RateLimiter {
  readonly #counts = new Map<string, { start: number; count: number }>();

  async hit(key: string, limit: number, windowMs: number, now: number): Promise<RateDecision> {
    const { start, resetAt } = windowOf(now, windowMs);
    const entry = this.#counts.get(key);
    const current = entry && entry.start === start ? entry : { start, count: 0 };
    current.count += 1;
    this.#counts.set(key, current);
    if (this.#counts.size > 100_000) this.#sweep(start);
    return decide(current.count, limit, resetAt);
  }

  async count(key: string, windowMs: number, now: number): Promise<number> {
    const entry = this.#counts.get(key);
    return entry && entry.start === windowOf(now, windowMs).start ? entry.count : 0;
  }

  async clear(key: string, _windowMs: number, _now: number): Promise<void> {
    this.#counts.delete(key);
  }

  #sweep(currentStart: number): void {
    for (const [k, v] of this.#counts) if (v.start < currentStart) this.#counts.delete(k);
  }

  async reachable(): Promise<boolean> {
    return true;
  }

  async close(): Promise<void> {}
}

/**
 * Counts in Redis. While Redis is unreachable, failing or not answering, each instance counts on
 * its own (a key may then get the limit once per instance) rather than refusing or delaying
 * requests: Redis holds only these windows, and usage recording and billing must not stop for
 * them. A command waits at most REDIS_COMMAND_TIMEOUT_MS, and after a failure none is sent until
 * a probe finds Redis answering again (RedisBreaker). `onOutage` is told once per outage.
 */
export class RedisRateLimiter implements RateLimiter {
  readonly #breaker: RedisBreaker;
  readonly #prefix: string;
  readonly #local = new MemoryRateLimiter();

  constructor(redis: Redis, opts: { prefix?: string; onOutage?: (err: unknown) => void; onRecovery?: () => void; probeIntervalMs?: number } = {}) {
    this.#breaker = new RedisBreaker(redis, { onOpen: opts.onOutage, onClose: opts.onRecovery }, opts.probeIntervalMs);
    this.#prefix = opts.prefix ?? 'tollgate:rl:';
  }

  async hit(key: string, limit: number, windowMs: number, now: number): Promise<RateDecision> {
    const redisKey = this.#windowKey(key, windowMs, now);
    try {
      const count = await this.#breaker.run((redis) => increment(redis, redisKey, windowMs));
      return decide(count, limit, windowOf(now, windowMs).resetAt);
    } catch {
      return this.#local.hit(key, limit, windowMs, now);
    }
  }

  async count(key: string, windowMs: number, now: number): Promise<number> {
    const redisKey = this.#windowKey(key, windowMs, now);
    try {
      return Number((await this.#breaker.run((redis) => redis.get(redisKey))) ?? 0);
    } catch {
      return this.#local.count(key, windowMs, now);
    }
  }

  async clear(key: string, windowMs: number, now: number): Promise<void> {
    const redisKey = this.#windowKey(key, windowMs, now);
    await this.#local.clear(key, windowMs, now);
    await this.#breaker.run((redis) => redis.del(redisKey)).catch(() => undefined);
  }

  /** False at once while the breaker is open; else whether a PING is answered in time. */
  async reachable(): Promise<boolean> {
    if (this.#breaker.isOpen) return false;
    return this.#breaker.run((redis) => redis.ping()).then(
      () => true,
      () => false,
    );
  }

  async close(): Promise<void> {
    this.#breaker.close();
  }

  /** The Redis key of `key`'s window holding `now`: a new window starts a new key. */
  #windowKey(key: string, windowMs: number, now: number): string {
    return `${this.#prefix}${key}:${windowOf(now, windowMs).start}`;
  }
}

async function increment(redis: Redis, redisKey: string, windowMs: number): Promise<number> {
  const results = await redis.multi().incr(redisKey).pexpire(redisKey, windowMs * 2).exec();
  const [err, count] = results?.[0] ?? [new Error('Redis returned no result for INCR'), null];
  if (err) throw err;
  return Number(count);
}
