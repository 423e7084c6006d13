import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { creditFor, maxRefund, type RefundBasis } from '../../src/domain/refund-math.ts';

const units = (max: bigint) => fc.bigInt({ min: 1n, max });

/** A payment, what its credit was, and a wallet holding some of that credit still. */
const basis = fc
  .record({ paid: units(10n ** 14n), credited: fc.bigInt({ min: 0n, max: 10n ** 14n }), unspentShare: fc.double({ min: 0, max: 1.5, noNaN: true }), step: fc.constantFrom(1n, 100_000_000n) })
  .map(({ paid, credited, unspentShare, step }): RefundBasis => {
    const roundedPaid = paid - (paid % step) || step;
    const unspent = BigInt(Math.floor(Number(credited) * unspentShare));
    return { paid: roundedPaid, credited, refunded: 0n, creditTakenBack: 0n, unspent, step };
  });

/** Refunds `amount` out of `b`: the basis that follows it (the wallet gave the credit up). */
function after(b: RefundBasis, amount: bigint): RefundBasis {
  const credit = creditFor(b, amount);
  return { ...b, refunded: b.refunded + amount, creditTakenBack: b.creditTakenBack + credit, unspent: b.unspent - credit };
}

describe('refund amounts', () => {
  it('a refund of the most allowed never takes back more credit than is unspent, nor refunds more than was paid', () => {
    fc.assert(
      fc.property(basis, (b) => {
        const most = maxRefund(b);
        expect(most >= 0n && most <= b.paid).toBe(true);
        if (most > 0n) expect(creditFor(b, most) <= (b.credited === 0n ? 0n : b.unspent)).toBe(true);
        expect(most % b.step === 0n || most === b.paid).toBe(true);
      }),
    );
  });

  it('refunds in parts add up to the payment and take back exactly its credit when all of it is unspent', () => {
    fc.assert(
      fc.property(basis, fc.array(fc.double({ min: 0.01, max: 1, noNaN: true }), { minLength: 1, maxLength: 5 }), (start, parts) => {
        let b: RefundBasis = { ...start, unspent: start.credited };
        for (const part of parts) {
          const most = maxRefund(b);
          const amount = BigInt(Math.floor(Number(most) * part)) || most;
          if (amount === 0n) break;
          b = after(b, amount);
        }
        const rest = maxRefund(b);
        if (rest > 0n) b = after(b, rest);
        expect(b.refunded).toBe(b.paid);
        expect(b.creditTakenBack).toBe(b.credited);
        expect(b.unspent).toBe(0n);
      }),
    );
  });

  it('credit is taken back at least in proportion to the money returned', () => {
    fc.assert(
      fc.property(basis, fc.double({ min: 0, max: 1, noNaN: true }), (b, share) => {
        const amount = BigInt(Math.floor(Number(b.paid) * share));
        if (amount === 0n || amount >= b.paid) return;
        expect(creditFor(b, amount) * b.paid >= amount * b.credited).toBe(true);
      }),
    );
  });
});
