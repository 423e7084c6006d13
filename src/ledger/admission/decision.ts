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
export function refusedPart(parts: readonly HoldPart[], availableOf: (walletId: string, amount: bigint) => bigint): HoldPart | undefined {
  return parts.find((part) => {
    const available = availableOf(part.walletId, part.amount);
    return available < part.amount || available <= 0n;
  });
}

/** A wallet as an admission reads it. */
export type AdmissionWallet = Pick<WalletRow, 'id' | 'balance' | 'held' | 'overrun' | 'cycle_credit' | 'bundle_credit'>;

/**
 * `wallets.overrun` is the excess the wallet's last overrun showed, per OVERRUN_SCALE of its hold
 * (0: none): a request held for 10 and charged 25 leaves 1,500. Capped so the column's integer holds it.
 */
export const OVERRUN_SCALE = 1_000n;
const MAX_OVERRUN = 1_000_000_000n;

/** What a charge of `cost` above its hold `held` records as the wallet's overrun (held > 0). */
export function overrunOf(cost: bigint, held: bigint): number {
  const excess = cost - held;
  if (excess <= 0n || held <= 0n) return 0;
  const perScale = (excess * OVERRUN_SCALE + held - 1n) / held;
  return Number(perScale > MAX_OVERRUN ? MAX_OVERRUN : perScale < 1n ? 1n : perScale);
}

/**
 * What an admission may take from a wallet: what the request may draw of it (availableFor: its
 * plan credit only when the request draws plan credit), less, while the wallet is overrun (settled
 * charges exceeded their holds) and requests are in flight on it (anything held, in the database
 * or by this process), what those and the new request (`amount`) may cost beyond their holds if
 * they overrun as much as the last one did. A wallet that can pay for that is admitted; one that
 * cannot is refused, so the loss stays bounded (decision 0025; it refused every admission while
 * anything was in flight, decision 0019).
 */
export function admittableOf(wallet: AdmissionWallet, unwritten: UnwrittenHolds | null | undefined, drawsPlanCredit: boolean, amount = 0n): bigint {
  const available = availableFor(wallet, unwritten, drawsPlanCredit);
  return available - overrunAllowance(wallet.overrun, inFlightOn(wallet, unwritten), amount);
}

/** What requests in flight on a wallet hold: in the database, or admitted by this process and not written yet. */
function inFlightOn(wallet: AdmissionWallet, unwritten: UnwrittenHolds | null | undefined): bigint {
  return BigInt(wallet.balance) - availableOf(wallet, unwritten);
}

/**
 * What requests in flight (`inFlight` held or reserved) and a new one (`amount`) may cost beyond
 * their holds if they overrun as much as the last overrun (`overrun`, per OVERRUN_SCALE): nothing
 * when nothing is in flight, where the overrun ends.
 */
export function overrunAllowance(overrun: number | undefined, inFlight: bigint, amount: bigint): bigint {
  const rate = BigInt(overrun ?? 0);
  if (rate === 0n || inFlight <= 0n) return 0n;
  return ((inFlight + amount) * rate + OVERRUN_SCALE - 1n) / OVERRUN_SCALE;
}

/**
 * The wallets among these whose overrun ends with this admission: nothing was in flight on them
 * (read before this admission's own holds are counted).
 */
export function overrunsEnded(
  parts: readonly HoldPart[],
  walletOf: (walletId: string) => AdmissionWallet | undefined,
  unwritten?: UnwrittenHolds | null,
): string[] {
  return [...new Set(parts.map((part) => part.walletId))].filter((walletId) => {
    const wallet = walletOf(walletId);
    return wallet !== undefined && Number(wallet.overrun ?? 0) !== 0 && inFlightOn(wallet, unwritten) <= 0n;
  });
}

/**
 * The wallets a settled request cost more than it held on them, each with the overrun it leaves
 * (overrunOf; the larger of it and the wallet's current one): while requests are in flight on
 * them, admissions count what those may cost beyond their holds (admittableOf). A request with
 * nothing held is not one.
 */
export function overrunWallets(price: PricedRequest, customerWallet: WalletRow, merchantWallet: WalletRow, heldOn: (wallet: WalletRow) => bigint): [WalletRow, number][] {
  const costOn = (wallet: WalletRow) => (wallet === customerWallet ? price.totals.wallet : 0n) + (wallet === merchantWallet ? price.totals.merchant : 0n);
  return [...new Set([customerWallet, merchantWallet])].flatMap((wallet): [WalletRow, number][] => {
    const overrun = overrunOf(costOn(wallet), heldOn(wallet));
    return overrun > 0 ? [[wallet, Math.max(overrun, Number(wallet.overrun ?? 0))]] : [];
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
