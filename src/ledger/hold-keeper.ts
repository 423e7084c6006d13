import type { FastifyBaseLogger } from 'fastify';
import { dateOf, type Clock } from '../domain/clock.ts';
import type { Storage } from '../storage/db.ts';

/** Holds renewed per statement: far below every engine's parameter limit. */
const RENEW_BATCH = 500;

/**
 * Keeps the holds of requests still relaying alive. A hold's TTL (HOLD_TTL_MS) is crash safety:
 * it must end holds nobody will settle, not a stream that simply runs long. So while a relay is
 * active its holds' `expires_at` is pushed to a full TTL ahead, every third of a TTL; once the
 * relay ends (or the instance dies) renewals stop and the TTL runs out as before.
 */
export class HoldKeeper {
  readonly #active = new Set<string>();
  readonly #storage: Storage;
  readonly #ttlMs: number;
  readonly #log: FastifyBaseLogger;
  readonly #clock: Clock;
  readonly #timer: NodeJS.Timeout;
  #renewing: Promise<void> | null = null;

  constructor(storage: Storage, ttlMs: number, log: FastifyBaseLogger, clock: Clock) {
    this.#storage = storage;
    this.#clock = clock;
    this.#ttlMs = ttlMs;
    this.#log = log;
    this.#timer = setInterval(() => this.#tick(), Math.max(100, Math.floor(ttlMs / 3)));
    this.#timer.unref();
  }

  /** The relay of these holds has started. */
  add(holdIds: readonly string[]): void {
    for (const id of holdIds) this.#active.add(id);
  }

  /** The relay of these holds has ended: settlement (or the TTL) takes over. */
  delete(holdIds: readonly string[]): void {
    for (const id of holdIds) this.#active.delete(id);
  }

  async close(): Promise<void> {
    clearInterval(this.#timer);
    await this.#renewing;
  }

  #tick(): void {
    if (this.#active.size === 0 || this.#renewing) return;
    this.#renewing = this.renew()
      .catch((err: unknown) => this.#log.warn({ err }, 'could not renew the holds of requests in flight'))
      .finally(() => {
        this.#renewing = null;
      });
  }

  /** Pushes every active relay's holds to a full TTL from now. Holds no longer active stay as they are. */
  async renew(now = dateOf(this.#clock)): Promise<void> {
    const ids = [...this.#active];
    const expiresAt = new Date(now.getTime() + this.#ttlMs).toISOString();
    for (let i = 0; i < ids.length; i += RENEW_BATCH) {
      await this.#storage.db
        .updateTable('holds')
        .set({ expires_at: expiresAt })
        .where('id', 'in', ids.slice(i, i + RENEW_BATCH))
        .where('status', '=', 'active')
        .execute();
    }
  }
}
