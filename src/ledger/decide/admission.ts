/**
 * The admission rule, pure: what a forwarded request holds on which wallet, and whether the
 * wallets can cover it. Every admission strategy (in one transaction, in one statement, deferred in
 * process, from leases) decides with these against the wallets as it sees them; the
 * in-transaction path is the reference the others are property-tested against.
 */
import type { WalletsTable } from '../../storage/schema.ts';
import { availableFor, availableOf, planCreditOf, type Unwritten } from './balance.ts';
import { overrunAllowance, overrunCounts, overrunEnds } from './overrun.ts';

/** One wallet's share of a request's estimate; `payer` says whose refusal it is. */
export type HoldPart = { walletId: string; amount: bigint; payer: 'wallet' | 'merchant' };

/** The holds to place; a wallet only counts as paying when its part of the estimate is above zero. */
export function holdParts(walletId: string, merchantWalletId: string, estimate: { wallet: bigint; merchant: bigint }): HoldPart[] {
  if (walletId === merchantWalletId) {
    const amount = estimate.wallet + estimate.merchant;
    return amount > 0n ? [{ walletId, amount, payer: 'merchant' }] : [];
  }
  const parts: HoldPart[] = [];
  if (estimate.wallet > 0n) parts.push({ walletId, amount: estimate.wallet, payer: 'wallet' });
  if (estimate.merchant > 0n) parts.push({ walletId: merchantWalletId, amount: estimate.merchant, payer: 'merchant' });
  return parts;
}

/**
 * The refusal, as data: the first part its wallet cannot cover (what it may take is below the
 * part, or at or below zero), or undefined when every part is covered.
 */
export function refusedPart(parts: readonly HoldPart[], admittable: (walletId: string, amount: bigint) => bigint): HoldPart | undefined {
  return parts.find((part) => {
    const available = admittable(part.walletId, part.amount);
    return available < part.amount || available <= 0n;
  });
}

/** A wallet as an admission reads it. */
export type AdmissionWallet = Pick<WalletsTable, 'id' | 'balance' | 'held' | 'overrun' | 'cycle_credit' | 'bundle_credit'>;

/**
 * What an admission may take from a wallet: what the request may draw of it (availableFor: its
 * plan credit only when the request draws plan credit), less, while the wallet is overrun and
 * requests are in flight on it (anything held, in the database or by this process), what those and
 * the new request (`amount`) may cost beyond their holds (overrunAllowance). A wallet that can pay
 * for that is admitted; one that cannot is refused, so the loss stays bounded (decision 0025).
 */
export function admittableOf(wallet: AdmissionWallet, unwritten: Unwritten | null | undefined, drawsPlan: boolean, amount = 0n): bigint {
  return availableFor(wallet, unwritten, drawsPlan) - overrunAllowance(wallet.overrun, inFlightOn(wallet, unwritten), amount);
}

/** What requests in flight on a wallet hold: in the database, or admitted by this process and not written yet. */
function inFlightOn(wallet: AdmissionWallet, unwritten: Unwritten | null | undefined): bigint {
  return BigInt(wallet.balance) - availableOf(wallet, unwritten);
}

/**
 * The wallets among these whose overrun ends with this admission: nothing was in flight on them
 * (read before this admission's own holds are counted).
 */
export function overrunsEnded(parts: readonly HoldPart[], walletOf: (walletId: string) => AdmissionWallet | undefined, unwritten?: Unwritten | null): string[] {
  return [...new Set(parts.map((part) => part.walletId))].filter((walletId) => {
    const wallet = walletOf(walletId);
    return wallet !== undefined && overrunEnds(wallet.overrun, inFlightOn(wallet, unwritten));
  });
}

/** A lease top-up's decision (leaseGrant): refused, refused for plan credit, or what to grant. */
export type LeaseGrant = { refused: 'plan_credit' | 'not_covered' } | { amount: bigint; endsOverrun: boolean };

/** No top-up takes more than this share of what the wallet has available (beyond what it needs). */
export const MAX_SHARE_OF_AVAILABLE = 4n;

/**
 * How much a wallet lease is raised by (decision 0013), from the wallet's locked row (on
 * PostgreSQL, where nothing is held in process but leases, which are rows): at least `need` (what
 * the admission waiting for it lacks), `want` when the wallet has plenty, within a quarter of what
 * it has free counting the lease's own `free` part. Refused when the wallet cannot cover `need`
 * under the admission rule (admittableOf), or has plan credit: a lease cannot tell whose usage may
 * draw it (decision 0016). An overrun wallet with requests in flight is leased exactly `need`, so
 * each admission is checked against what those may overrun, as in the database.
 */
export function leaseGrant(wallet: AdmissionWallet, need: bigint, want: bigint, free: bigint): LeaseGrant {
  if (planCreditOf(wallet) > 0n) return { refused: 'plan_credit' };
  const available = admittableOf(wallet, null, true, need);
  if (available < need || available <= 0n) return { refused: 'not_covered' };
  const overrunInFlight = overrunCounts(wallet.overrun, BigInt(wallet.held));
  if (overrunInFlight) return need > 0n ? { amount: need, endsOverrun: false } : { refused: 'not_covered' };
  // The lease as a whole, not each top-up, stays within a quarter of what the wallet has free,
  // so refills cannot park the rest of the wallet in it a quarter at a time.
  const room = (available + free) / MAX_SHARE_OF_AVAILABLE - free;
  const capped = room > 0n ? room : 0n;
  // An overrun wallet admitted here with nothing in flight: its overrun ends (decision 0019).
  return { amount: want < capped ? want : capped > need ? capped : need, endsOverrun: true };
}
