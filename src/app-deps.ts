/**
 * What the app is built from, named here (beside app.ts, below nothing) so that every layer may
 * see the type without importing the layers whose parts it names: http/ stays free of commerce
 * and payments, and a route, a service or a page takes the same AppDeps.
 */
import type { DestinationStream } from 'pino';
import type { Config } from './config.ts';
import type { Clock } from './domain/clock.ts';
import type { PaymentProvider } from './payments/types.ts';
import type { Storage } from './storage/db.ts';
import type { RateLimiter } from './http/rate-limit.ts';
import type { CommerceState } from './commerce/state.ts';
import type { CallJournal } from './ledger/journal/journal.ts';

/** Everything the app needs from outside; tests build it with real storage and limiters. */
export type AppDeps = {
  config: Config;
  storage: Storage;
  rateLimiter: RateLimiter;
  /** Every decision by time reads this clock (holds, leases, spend-key limits, caches). */
  clock: Clock;
  /** Takes payments for checkout, renewals and auto top-up (the built-in test provider unless configured). */
  payments: PaymentProvider;
  /** What checkout and auto top-up keep in process between requests. */
  commerceState: CommerceState;
  /** Where logs go instead of stdout (tests read them back). */
  logStream?: DestinationStream;
  /** The instance's call journal (decision 0024), opened and replayed by the server before it serves; none in tests' apps unless given. */
  journal?: CallJournal;
};

/**
 * What buildApp is given: the clock defaults to the system's, the payment provider to the one the
 * configuration selects, the commerce state to a new one (the server gives the one its background loops share).
 */
export type AppOptions = Omit<AppDeps, 'clock' | 'payments' | 'commerceState'> & { clock?: Clock; payments?: PaymentProvider; commerceState?: CommerceState };
