import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { admittableOf, leaseGrant, MAX_SHARE_OF_AVAILABLE, refusedPart, type AdmissionWallet } from '../../src/ledger/decide/admission.ts';
import { availableFor, drawsPlanCredit } from '../../src/ledger/decide/balance.ts';
import { entriesInLockOrder, inLockOrder } from '../../src/ledger/decide/lock-order.ts';
import { isOverrun, overrunAfterCharge, overrunAllowance, overrunCounts, overrunEnds, overrunOf } from '../../src/ledger/decide/overrun.ts';

/**
 * The pure decision core (src/ledger/decide/) on random facts: the overrun rule that wallets and
 * spend keys share, the lease top-up that must decide as an admission in the database does, the
 * plan-credit flag and the global lock order.
 */

const units = fc.bigInt({ min: 0n, max: 10_000n });
const overrunRate = fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 5_000 }));

const wallet: fc.Arbitrary<AdmissionWallet> = fc
  .record({ balance: units, held: units, overrun: overrunRate, cycle: fc.oneof(fc.constant(0n), units), bundle: fc.oneof(fc.constant(0n), units) })
  .map(({ balance, held, overrun, cycle, bundle }) => ({
    id: 'wal_a',
    balance: balance + cycle + bundle,
    held,
    overrun,
    cycle_credit: cycle,
    bundle_credit: bundle,
  }));

describe('the overrun rule', () => {
  it('counts only while an overrun is recorded and something is in flight, and ends on the first admission with nothing in flight', () => {
    fc.assert(
      fc.property(overrunRate, fc.bigInt({ min: -5n, max: 10_000n }), units, (overrun, inFlight, amount) => {
        expect(overrunCounts(overrun, inFlight) && overrunEnds(overrun, inFlight)).toBe(false);
        expect(overrunCounts(overrun, inFlight) || overrunEnds(overrun, inFlight)).toBe(isOverrun(overrun));
        const allowance = overrunAllowance(overrun, inFlight, amount);
        if (!overrunCounts(overrun, inFlight)) expect(allowance).toBe(0n);
        else expect(allowance * 1_000n).toBeGreaterThanOrEqual((inFlight + amount) * BigInt(overrun));
      }),
    );
  });

  it('a charge leaves an overrun only above a hold, never lowers the recorded one, and rounds its rate up', () => {
    fc.assert(
      fc.property(units, units, overrunRate, (cost, held, current) => {
        const left = overrunAfterCharge(cost, held, current);
        if (cost <= held || held === 0n) {
          expect(left).toBeNull();
        } else {
          expect(left).toBe(Math.max(overrunOf(cost, held), current));
          expect(BigInt(overrunOf(cost, held)) * held).toBeGreaterThanOrEqual((cost - held) * 1_000n);
        }
      }),
    );
  });
});

describe('a lease top-up', () => {
  it('grants what it needs exactly when the admission rule would admit it (need > 0), and never leases a wallet with plan credit', () => {
    fc.assert(
      fc.property(wallet, fc.bigInt({ min: 1n, max: 10_000n }), units, units, (w, need, want, free) => {
        const grant = leaseGrant(w, need, need + want, free);
        if (w.cycle_credit + w.bundle_credit > 0n) {
          expect(grant).toEqual({ refused: 'plan_credit' });
        } else {
          const reference = refusedPart([{ walletId: w.id, amount: need, payer: 'wallet' }], (_id, amount) => admittableOf(w, null, true, amount));
          expect('refused' in grant).toBe(reference !== undefined);
        }
      }),
    );
  });

  it('grants at least the need, no more than a quarter of what is free beyond it, and exactly the need on an overrun wallet in flight', () => {
    fc.assert(
      // A top-up always wants at least what it needs (a number of requests' shares).
      fc.property(wallet, fc.bigInt({ min: 0n, max: 10_000n }), units, units, (w, need, extra, free) => {
        const want = need + extra;
        // Leases are only granted on wallets without plan credit: the same wallet, its plan credit taken out.
        const prepaid = { ...w, cycle_credit: 0n, bundle_credit: 0n, balance: w.balance - w.cycle_credit - w.bundle_credit };
        const grant = leaseGrant(prepaid, need, want, free);
        if ('refused' in grant) return;
        expect(grant.amount).toBeGreaterThanOrEqual(need);
        if (overrunCounts(w.overrun, w.held)) {
          expect(grant).toEqual({ amount: need, endsOverrun: false });
          return;
        }
        expect(grant.endsOverrun).toBe(true);
        const available = admittableOf(prepaid, null, true, need);
        const room = (available + free) / MAX_SHARE_OF_AVAILABLE - free;
        expect(grant.amount <= need || grant.amount <= room).toBe(true);
        expect(grant.amount <= want || grant.amount <= room).toBe(true);
      }),
    );
  });
});

describe('plan credit', () => {
  it('is drawn only when the billing says so, and then adds exactly the wallet plan credit to what it may take', () => {
    fc.assert(
      fc.property(wallet, fc.option(fc.boolean(), { nil: undefined }), (w, flag) => {
        const draws = drawsPlanCredit({ drawsPlanCredit: flag });
        expect(draws).toBe(flag === true);
        expect(availableFor(w, null, true) - availableFor(w, null, false)).toBe(w.cycle_credit + w.bundle_credit);
      }),
    );
  });
});

describe('the lock order', () => {
  it('takes each id once, ascending, whatever order the ids came in', () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom('wal_a', 'wal_b', 'wal_B', 'wal_c1', 'wal_c', 'key_1')), (ids) => {
        const ordered = inLockOrder(ids);
        expect(new Set(ordered)).toEqual(new Set(ids));
        expect(ordered.length).toBe(new Set(ids).size);
        for (let i = 1; i < ordered.length; i++) expect(ordered[i - 1]! < ordered[i]!).toBe(true);
        expect(entriesInLockOrder(new Map(ids.map((id) => [id, id]))).map(([id]) => id)).toEqual(ordered);
      }),
    );
  });
});
