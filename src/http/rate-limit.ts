import type { Redis } from 'ioredis';

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

  #sweep(currentStart: number): void {
    for (const [k, v] of this.#counts) if (v.start < currentStart) this.#counts.delete(k);
  }

  async reachable(): Promise<boolean> {
    return true;
  }

  async close(): Promise<void> {}
}

const PING_TIMEOUT_MS = 1_000;

/**
 * Counts in Redis. While Redis is unreachable or failing, each instance counts on its own (a key
 * may then get the limit once per instance) rather than refusing every request: Redis holds only
 * these windows, and usage recording and billing must not stop for them. `onOutage` is told once
 * per outage.
 */
export class RedisRateLimiter implements RateLimiter {
  readonly #redis: Redis;
  readonly #prefix: string;
  readonly #onOutage: (err: unknown) => void;
  readonly #local = new MemoryRateLimiter();
  #inOutage = false;

  constructor(redis: Redis, opts: { prefix?: string; onOutage?: (err: unknown) => void } = {}) {
    this.#redis = redis;
    this.#prefix = opts.prefix ?? 'tollgate:rl:';
    this.#onOutage = opts.onOutage ?? (() => {});
  }

  async hit(key: string, limit: number, windowMs: number, now: number): Promise<RateDecision> {
    // Known to be down and not back yet: answer at once from the local count instead of queueing
    // behind reconnects. (Before the first connection, commands wait in ioredis' offline queue.)
    if (this.#inOutage && this.#redis.status !== 'ready') {
      return this.#countLocally(key, limit, windowMs, now, new Error(`Redis connection is ${this.#redis.status}`));
    }
    const { start, resetAt } = windowOf(now, windowMs);
    try {
      const count = await this.#increment(`${this.#prefix}${key}:${start}`, windowMs);
      this.#inOutage = false;
      return decide(count, limit, resetAt);
    } catch (err) {
      return this.#countLocally(key, limit, windowMs, now, err);
    }
  }

  async #increment(redisKey: string, windowMs: number): Promise<number> {
    const results = await this.#redis.multi().incr(redisKey).pexpire(redisKey, windowMs * 2).exec();
    const [err, count] = results?.[0] ?? [new Error('Redis returned no result for INCR'), null];
    if (err) throw err;
    return Number(count);
  }

  #countLocally(key: string, limit: number, windowMs: number, now: number, err: unknown): Promise<RateDecision> {
    if (!this.#inOutage) {
      this.#inOutage = true;
      this.#onOutage(err);
    }
    return this.#local.hit(key, limit, windowMs, now);
  }

  async reachable(): Promise<boolean> {
    if (this.#inOutage && this.#redis.status !== 'ready') return false;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), PING_TIMEOUT_MS)));
    try {
      return await Promise.race([this.#redis.ping().then(() => true), timeout]);
    } catch {
      return false;
    } finally {
      clearTimeout(timer);
    }
  }

  async close(): Promise<void> {}
}
