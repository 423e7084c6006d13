/**
 * The admission rule, pure: what a forwarded request holds on which wallet, and whether the
 * wallets can cover it. Every admission path (in one transaction, in one statement, deferred in
 * process, from leases) decides with these, against the wallets as that path sees them; the
 * in-transaction path is the reference the others are property-tested against.
 */
import { newId } from '../../domain/ids.ts';
import type { PricedRequest } from '../../domain/pricing.ts';
import type { HoldRow } from '../holds.ts';
import { availableFor, availableOf, type UnwrittenHolds, type WalletRow } from '../wallets.ts';

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
 * The refusal, as data: the first part its wallet cannot cover (its available balance is below the
 * part, or at or below zero), or undefined when every part is covered.
 */
export function refusedPart(parts: readonly HoldPart[], availableOf: (walletId: string) => bigint): HoldPart | undefined {
  return parts.find((part) => {
    const available = availableOf(part.walletId);
    return available < part.amount || available <= 0n;
  });
}

/** A wallet as an admission reads it. */
export type AdmissionWallet = Pick<WalletRow, 'id' | 'balance' | 'held' | 'overrun' | 'cycle_credit' | 'bundle_credit'>;

/**
 * What an admission may take from a wallet: what the request may draw of it (availableFor: its
 * plan credit only when the request draws plan credit), or nothing while it is overrun (settled
 * charges exceeded their holds) and requests are still in flight on it (anything held, in the
 * database or by this process): those may overrun too, so nothing more is promised until they
 * have settled (decision 0019).
 */
export function admittableOf(wallet: AdmissionWallet, unwritten: UnwrittenHolds | null | undefined, drawsPlanCredit: boolean): bigint {
  const available = availableFor(wallet, unwritten, drawsPlanCredit);
  const inFlight = BigInt(wallet.balance) - availableOf(wallet, unwritten);
  return Number(wallet.overrun ?? 0) !== 0 && inFlight > 0n ? 0n : available;
}

/** The wallets among these whose overrun ends with this admission: nothing was in flight on them. */
export function overrunsEnded(parts: readonly HoldPart[], walletOf: (walletId: string) => AdmissionWallet | undefined): string[] {
  return [...new Set(parts.map((part) => part.walletId))].filter((walletId) => Number(walletOf(walletId)?.overrun ?? 0) !== 0);
}

/**
 * The wallets a settled request cost more than it held on them: they admit nothing more until
 * their requests in flight have settled (decision 0019). A request with nothing held is not one.
 */
export function overrunWallets(price: PricedRequest, customerWallet: WalletRow, merchantWallet: WalletRow, heldOn: (wallet: WalletRow) => bigint): WalletRow[] {
  const costOn = (wallet: WalletRow) => (wallet === customerWallet ? price.totals.wallet : 0n) + (wallet === merchantWallet ? price.totals.merchant : 0n);
  return [...new Set([customerWallet, merchantWallet])].filter((wallet) => {
    const held = heldOn(wallet);
    return held > 0n && costOn(wallet) > held;
  });
}

/** The hold rows of an admitted request's parts, active from `now` for `ttlMs`. */
export function holdRowsOf(parts: readonly HoldPart[], recordId: string, now: Date, ttlMs: number): HoldRow[] {
  const createdAt = now.toISOString();
  const expiresAt = new Date(now.getTime() + ttlMs).toISOString();
  return parts.map((part) => ({
    id: newId('hold'),
    wallet_id: part.walletId,
    reference: recordId,
    amount: part.amount,
    status: 'active',
    created_at: createdAt,
    expires_at: expiresAt,
  }));
}
