/**
 * How much of a payment a refund may give back, and how much credit it takes back for it. A refund
 * takes back credit in proportion to the money it returns (a bundle bought for 4 that gave 5 of
 * credit takes back 5/4 of each unit refunded), and never more credit than the wallet still holds
 * of it: a customer cannot be refunded money they already spent. The refund that returns the last
 * of the payment takes back the last of its credit, so rounding never leaves a remainder.
 */
export type RefundBasis = {
  /** What the customer paid. */
  paid: bigint;
  /** What the payment credited (zero for a payment that was never credited). */
  credited: bigint;
  /** Money earlier refunds gave back (pending ones included). */
  refunded: bigint;
  /** Credit earlier refunds took back. */
  creditTakenBack: bigint;
  /** Credit of the payment's bucket the wallet can give up now (its bucket, less what holds keep). */
  unspent: bigint;
  /** The smallest step the provider refunds in (a cent for Stripe); 1 for any amount. */
  step: bigint;
};

const min = (a: bigint, b: bigint) => (a < b ? a : b);
const floorTo = (amount: bigint, step: bigint) => amount - (amount % step);

/** The most money a refund can give back now. */
export function maxRefund(b: RefundBasis): bigint {
  const leftMoney = b.paid - b.refunded;
  if (leftMoney <= 0n) return 0n;
  const leftCredit = b.credited - b.creditTakenBack;
  if (b.credited === 0n || b.unspent >= leftCredit) return leftMoney;
  const usable = b.unspent > 0n ? b.unspent : 0n;
  return floorTo(min(leftMoney, (usable * b.paid) / b.credited), b.step);
}

/** The credit a refund of `amount` takes back (at most what is left of the payment's credit). */
export function creditFor(b: RefundBasis, amount: bigint): bigint {
  const leftCredit = b.credited - b.creditTakenBack;
  if (amount >= b.paid - b.refunded) return leftCredit;
  const proportional = (amount * b.credited + b.paid - 1n) / b.paid;
  return min(proportional, leftCredit);
}
