import type { FastifyBaseLogger } from 'fastify';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { Dispatcher as HttpDispatcher } from 'undici';
import type { Storage } from '../storage/db.ts';
import { claimDueDeliveries, fanOutEvents, oldestDueAt, recordOutcome, type ClaimedDelivery } from '../storage/webhook-deliveries.ts';
import { pruneDeliveredEvents } from '../storage/webhook-retention.ts';
import { deliveredName, payloadText } from './events.ts';
import { retryDelayMs, shouldDisable } from './schedule.ts';
import { createDeliveryAgent, sendDelivery } from './sender.ts';
import { signatureHeaders } from './signing.ts';
import { systemResolver, type Resolver, type UrlPolicy } from './url-safety.ts';

/** Deliveries in flight to one endpoint from one process: a slow endpoint holds at most these. */
const PER_ENDPOINT_CONCURRENCY = 4;
const DEFAULT_POLL_MS = 100;
export const DEFAULT_RETENTION_DAYS = 30;
const ERROR_RETRY_MS = 2_000;
const DAY_MS = 86_400_000;
/** How often a process looks for delivered events past their retention. */
const PRUNE_EVERY_MS = 10 * 60_000;
/** Batches one round deletes at most, so pruning a large backlog never holds up deliveries for long. */
const PRUNE_BATCHES_PER_ROUND = 10;

export type DispatcherOptions = {
  storage: Storage;
  policy: UrlPolicy;
  timeoutMs: number;
  /** Deliveries in flight at once in this process, over all endpoints. */
  maxConcurrency: number;
  log: FastifyBaseLogger;
  /** Where its counters go (the app's /metrics registry). */
  registry?: Registry;
  /** Milliseconds since the epoch; the app's clock (tests move it instead of sleeping). */
  now?: () => number;
  /** Uniform in [0, 1): spreads retry times. */
  random?: () => number;
  resolve?: Resolver;
  pollIntervalMs?: number;
  /** Events whose deliveries are all final are deleted, with them, this many days after (WEBHOOK_RETENTION_DAYS). */
  retentionDays?: number;
};

/**
 * Delivers the outbox's events to webhooks, off the request path: every `pollIntervalMs` (and as
 * soon as a send frees a slot) it fans new events out into deliveries, claims the due ones this
 * process has room for, and sends them concurrently, recording each outcome and the next attempt.
 * Every server process runs one; PostgreSQL row locks keep them from taking the same work.
 */
export class WebhookDispatcher {
  private readonly opts: Required<Omit<DispatcherOptions, 'registry'>>;
  private readonly agent: HttpDispatcher;
  private readonly inFlight = new Map<string, number>();
  private readonly sends = new Set<Promise<void>>();
  private readonly metrics: ReturnType<typeof registerMetrics> | null;
  private timer: NodeJS.Timeout | null = null;
  private ticking: Promise<void> | null = null;
  private again = false;
  /** The clock's time of the last prune that found nothing more to delete (null: none yet). */
  private prunedAt: number | null = null;
  /** Until start(), rounds run only when tick() is called (tests drive them by hand). */
  private stopped = true;

  constructor(options: DispatcherOptions) {
    this.opts = {
      now: Date.now,
      random: Math.random,
      resolve: systemResolver,
      pollIntervalMs: DEFAULT_POLL_MS,
      retentionDays: DEFAULT_RETENTION_DAYS,
      ...options,
    };
    this.agent = createDeliveryAgent(this.opts.policy, this.opts.resolve, this.opts.timeoutMs);
    this.metrics = options.registry ? registerMetrics(options.registry, this) : null;
  }

  start(): void {
    this.stopped = false;
    this.schedule(0);
  }

  /** Stops taking work and waits for the sends in flight (each ends within the timeout). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.ticking;
    await this.drain();
    await this.agent.close();
  }

  /** Waits until no send is in flight (tests). */
  async drain(): Promise<void> {
    while (this.sends.size > 0) await Promise.allSettled([...this.sends]);
  }

  get inFlightCount(): number {
    return this.sends.size;
  }

  /**
   * One round: fan out new events, claim what is due and start sending it. Returns once the
   * sends have started, not finished. Runs one at a time; a call during a round asks for another.
   */
  async tick(): Promise<void> {
    if (this.ticking) {
      this.again = true;
      return this.ticking;
    }
    this.ticking = this.round().finally(() => {
      this.ticking = null;
    });
    return this.ticking;
  }

  /** When the oldest waiting work fell due, for the queue-lag gauge. */
  async oldestDueAt(): Promise<number | null> {
    const at = await oldestDueAt(this.opts.storage, this.nowIso());
    return at === null ? null : Date.parse(at);
  }

  now(): number {
    return this.opts.now();
  }

  private nowIso(): string {
    return new Date(this.opts.now()).toISOString();
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = null;
      this.tick().then(
        () => this.schedule(this.again ? 0 : this.opts.pollIntervalMs),
        (err: unknown) => {
          // The database is likely away: try again, but not as fast as a poll (and not a log line per poll).
          this.opts.log.error({ err }, 'webhook dispatcher round failed');
          this.schedule(Math.max(ERROR_RETRY_MS, this.opts.pollIntervalMs));
        },
      );
    }, delayMs);
    this.timer.unref();
  }

  private async round(): Promise<void> {
    this.again = false;
    await this.pruneIfDue();
    const at = this.nowIso();
    const fannedOut = await fanOutEvents(this.opts.storage, at, deliveredName);
    const room = this.opts.maxConcurrency - this.sends.size;
    if (room <= 0) return;
    const busy = [...this.inFlight].filter(([, n]) => n >= PER_ENDPOINT_CONCURRENCY).map(([id]) => id);
    const claimed = await claimDueDeliveries(this.opts.storage, {
      at,
      leaseUntil: new Date(this.opts.now() + this.leaseMs()).toISOString(),
      limit: room,
      busy,
      roomFor: (id) => PER_ENDPOINT_CONCURRENCY - (this.inFlight.get(id) ?? 0),
    });
    for (const delivery of claimed) this.startSend(delivery);
    if (fannedOut.events > 0 || claimed.length === room) this.again = true;
  }

  /**
   * Deletes delivered (and finally failed) events past the retention period with their
   * deliveries, a bounded number of batches per round; a backlog continues in the next rounds.
   * A failure is logged and retried at the next interval: it never stops deliveries.
   */
  private async pruneIfDue(): Promise<void> {
    const nowMs = this.opts.now();
    if (this.prunedAt !== null && nowMs - this.prunedAt < PRUNE_EVERY_MS) return;
    const before = new Date(nowMs - this.opts.retentionDays * DAY_MS).toISOString();
    try {
      for (let batch = 0; batch < PRUNE_BATCHES_PER_ROUND; batch++) {
        const { full } = await pruneDeliveredEvents(this.opts.storage, before);
        if (!full) {
          this.prunedAt = nowMs;
          return;
        }
      }
      this.again = true;
    } catch (err) {
      this.prunedAt = nowMs;
      this.opts.log.error({ err }, 'pruning delivered webhook events failed');
    }
  }

  /** A claimed delivery falls due again after this, should this process die before recording it. */
  private leaseMs(): number {
    return this.opts.timeoutMs + Math.max(1_000, this.opts.timeoutMs / 2);
  }

  private startSend(delivery: ClaimedDelivery): void {
    this.inFlight.set(delivery.webhookId, (this.inFlight.get(delivery.webhookId) ?? 0) + 1);
    const send = this.deliver(delivery)
      .catch((err: unknown) => this.opts.log.error({ err, delivery_id: delivery.id, webhook_id: delivery.webhookId }, 'webhook delivery could not be recorded'))
      .finally(() => {
        const left = (this.inFlight.get(delivery.webhookId) ?? 1) - 1;
        if (left > 0) this.inFlight.set(delivery.webhookId, left);
        else this.inFlight.delete(delivery.webhookId);
        this.sends.delete(send);
        // A slot is free: look for more work now rather than at the next poll.
        if (!this.stopped) this.schedule(0);
      });
    this.sends.add(send);
  }

  private async deliver(delivery: ClaimedDelivery): Promise<void> {
    const body = payloadText({ id: delivery.eventId, created_at: delivery.eventCreatedAt, payload: delivery.payload }, delivery.eventType);
    const headers = signatureHeaders(body, delivery.eventId, delivery.secrets, Math.floor(this.opts.now() / 1000));
    this.metrics?.attempted.inc();
    const outcome = await sendDelivery(this.agent, this.opts.policy, { url: delivery.url, body, headers, timeoutMs: this.opts.timeoutMs });
    const nowMs = this.opts.now();
    const succeeded = outcome.kind === 'answered' && outcome.status >= 200 && outcome.status < 300;
    const delay = succeeded ? null : retryDelayMs(delivery.attempt, this.opts.random);
    const state = await recordOutcome(this.opts.storage, delivery, {
      at: new Date(nowMs).toISOString(),
      statusCode: outcome.kind === 'answered' ? outcome.status : null,
      error: outcome.kind === 'failed' ? outcome.error : null,
      responseBody: outcome.kind === 'answered' ? outcome.body : null,
      durationMs: outcome.ms,
      succeeded,
      nextAttemptAt: delay === null ? null : new Date(nowMs + delay).toISOString(),
      disableIfFailingSince: (since) => shouldDisable(Date.parse(since), nowMs),
    });
    if (succeeded) this.metrics?.succeeded.inc();
    else {
      this.metrics?.failedAttempts.inc();
      if (state === 'failed') this.metrics?.failed.inc();
      // Ids, status and a short error code only: never the URL (it may carry a token), the body or a secret.
      this.opts.log.info(
        {
          webhook_id: delivery.webhookId,
          delivery_id: delivery.id,
          event_id: delivery.eventId,
          attempt: delivery.attempt,
          status: outcome.kind === 'answered' ? outcome.status : undefined,
          error: outcome.kind === 'failed' ? outcome.error : undefined,
          state,
        },
        'webhook delivery attempt failed',
      );
    }
  }
}

function registerMetrics(registry: Registry, dispatcher: WebhookDispatcher) {
  const counter = (name: string, help: string) => new Counter({ name, help, registers: [registry] });
  new Gauge({
    name: 'tollgate_webhook_queue_lag_seconds',
    help: 'Age of the oldest webhook work that is due and not yet sent (0 when none)',
    registers: [registry],
    async collect() {
      const oldest = await dispatcher.oldestDueAt().catch(() => null);
      this.set(oldest === null ? 0 : Math.max(0, (dispatcher.now() - oldest) / 1000));
    },
  });
  new Gauge({
    name: 'tollgate_webhook_deliveries_in_flight',
    help: 'Webhook deliveries being sent by this process',
    registers: [registry],
    collect() {
      this.set(dispatcher.inFlightCount);
    },
  });
  return {
    attempted: counter('tollgate_webhook_delivery_attempts_total', 'Webhook delivery attempts made'),
    succeeded: counter('tollgate_webhook_deliveries_succeeded_total', 'Webhook deliveries a receiver accepted with a 2xx'),
    failedAttempts: counter('tollgate_webhook_delivery_attempts_failed_total', 'Webhook delivery attempts that got no 2xx (non-2xx, timeout, refused address, network error)'),
    failed: counter('tollgate_webhook_deliveries_failed_total', 'Webhook deliveries that used up every attempt'),
  };
}
