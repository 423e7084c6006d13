/**
 * The overrun rule, pure and written once (decisions 0019, 0025). A request settled above its hold
 * leaves its wallet (or spend key) "overrun" at the rate it overran; while anything is in flight
 * there, admissions count what those requests and the new one may cost beyond their holds at that
 * rate; the first admission that finds nothing in flight ends the overrun. Wallets and spend keys
 * both apply it through these functions.
 */

/**
 * `overrun` columns hold the excess of the last overrun per OVERRUN_SCALE of its hold (0: none): a
 * request held for 10 and charged 25 leaves 1,500. Capped so the column's integer holds it.
 */
const OVERRUN_SCALE = 1_000n;
const MAX_OVERRUN = 1_000_000_000n;

/** Whether an overrun is recorded (the column is not 0). */
export const isOverrun = (overrun: number | undefined): boolean => Number(overrun ?? 0) !== 0;

/** An overrun counts against admissions while something (`inFlight` held or reserved) is in flight. */
export const overrunCounts = (overrun: number | undefined, inFlight: bigint): boolean => isOverrun(overrun) && inFlight > 0n;

/** An admission that finds nothing in flight on an overrun wallet or key ends its overrun. */
export const overrunEnds = (overrun: number | undefined, inFlight: bigint): boolean => isOverrun(overrun) && inFlight <= 0n;

/** What a charge of `cost` above its hold `held` records as the overrun (0 for none, or nothing held). */
export function overrunOf(cost: bigint, held: bigint): number {
  const excess = cost - held;
  if (excess <= 0n || held <= 0n) return 0;
  const perScale = (excess * OVERRUN_SCALE + held - 1n) / held;
  return Number(perScale > MAX_OVERRUN ? MAX_OVERRUN : perScale < 1n ? 1n : perScale);
}

/**
 * The overrun a settled charge leaves where one (`current`) is recorded already: the larger of the
 * two, or null when the charge did not overrun (the recorded one stays as it is).
 */
export function overrunAfterCharge(cost: bigint, held: bigint, current: number | undefined): number | null {
  const overrun = overrunOf(cost, held);
  return overrun > 0 ? Math.max(overrun, Number(current ?? 0)) : null;
}

/**
 * What requests in flight (`inFlight` held or reserved) and a new one (`amount`) may cost beyond
 * their holds if they overrun as much as the last overrun: nothing when nothing is in flight.
 */
export function overrunAllowance(overrun: number | undefined, inFlight: bigint, amount: bigint): bigint {
  if (!overrunCounts(overrun, inFlight)) return 0n;
  return ((inFlight + amount) * BigInt(overrun!) + OVERRUN_SCALE - 1n) / OVERRUN_SCALE;
}
