import type { RateLimiter } from '../http/rate-limit.ts';
import { HOSTED_CHECKOUT_CLOSED, NOT_CHARGED, UNANSWERED } from '../payments/types.ts';
import type { Storage } from '../storage/db.ts';
import { countCheckoutDeclines, type CheckoutSessionRow } from '../storage/checkout-sessions.ts';

/**
 * Card testing: someone holding a checkout link (or many) tries stolen card numbers until one
 * pays. Declines are counted per session, in the database (a session that reaches the limit is
 * locked for good, on every instance), and per client address, in the app's rate-limit windows
 * (shared through Redis when configured), across sessions.
 */
export const DECLINES_PER_SESSION = 5;
export const DECLINES_PER_ADDRESS = 10;
export const ADDRESS_WINDOW_MS = 60 * 60_000;

export type CheckoutLimitDeps = { storage: Storage; rateLimiter: RateLimiter; clock: { now(): number } };

/** Why a payment attempt is refused before the provider sees it (429), or null when it may go ahead. */
export type AttemptRefusal = { message: string; retryAfterS: number | null };

const addressKey = (ip: string) => `checkout-declines:${ip}`;

export async function refusalOfAttempt(deps: CheckoutLimitDeps, session: CheckoutSessionRow, ip: string): Promise<AttemptRefusal | null> {
  if (await isSessionLocked(deps, session)) return sessionLocked();
  const now = deps.clock.now();
  if ((await deps.rateLimiter.count(addressKey(ip), ADDRESS_WINDOW_MS, now)) >= DECLINES_PER_ADDRESS) {
    const retryAfterS = Math.max(1, Math.ceil((windowEnd(now) - now) / 1000));
    const minutes = Math.ceil(retryAfterS / 60);
    return { message: `Too many declined cards from your network. Nothing was charged; try again in ${minutes} minute${minutes === 1 ? '' : 's'}.`, retryAfterS };
  }
  return null;
}

/** A session locked by its declines: no retry helps, the shop has to make a new one. */
export function sessionLocked(): AttemptRefusal {
  return { message: `This checkout is locked after ${DECLINES_PER_SESSION} declined cards. Nothing was charged; ask the shop for a new checkout link.`, retryAfterS: null };
}

/** Whether the session's declines have locked it (the page shows the lock instead of the form). */
export async function isSessionLocked(deps: Pick<CheckoutLimitDeps, 'storage'>, session: CheckoutSessionRow): Promise<boolean> {
  return (await countCheckoutDeclines(deps.storage.db, session.id, [UNANSWERED, HOSTED_CHECKOUT_CLOSED, NOT_CHARGED])) >= DECLINES_PER_SESSION;
}

/** Counts a card the provider declined against the client's address. */
export async function recordDecline(deps: CheckoutLimitDeps, ip: string): Promise<void> {
  await deps.rateLimiter.hit(addressKey(ip), DECLINES_PER_ADDRESS, ADDRESS_WINDOW_MS, deps.clock.now());
}

function windowEnd(now: number): number {
  return (Math.floor(now / ADDRESS_WINDOW_MS) + 1) * ADDRESS_WINDOW_MS;
}
