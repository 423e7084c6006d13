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
  hit(key: string, limit: number, windowMs: number): Promise<RateDecision>;
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

  async hit(key: string, limit: number, windowMs: number): Promise<RateDecision> {
    const now = Date.now();
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

  async close(): Promise<void> {}
}

export class RedisRateLimiter implements RateLimiter {
  readonly #redis: Redis;
  readonly #prefix: string;

  constructor(redis: Redis, prefix = 'tollgate:rl:') {
    this.#redis = redis;
    this.#prefix = prefix;
  }

  async hit(key: string, limit: number, windowMs: number): Promise<RateDecision> {
    const { start, resetAt } = windowOf(Date.now(), windowMs);
    const redisKey = `${this.#prefix}${key}:${start}`;
    const results = await this.#redis.multi().incr(redisKey).pexpire(redisKey, windowMs * 2).exec();
    const count = Number(results?.[0]?.[1] ?? 0);
    return decide(count, limit, resetAt);
  }

  async close(): Promise<void> {}
}
