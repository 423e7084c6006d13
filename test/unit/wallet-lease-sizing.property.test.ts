import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { refillBelowRequests, sizeByRate, type Lease } from '../../src/ledger/leases.ts';

/** Decision 0013: a lease's top-ups are sized by the rate of admissions it saw, within bounds. */

function leaseThatTook(taken: number, overMs: number, now: number): Lease {
  return {
    holdId: 'hold_x',
    walletId: 'wal_x',
    free: 0n,
    inFlight: 0,
    lastUsed: now,
    retired: false,
    takenSinceTopUp: taken,
    topUpStartedAt: now - overMs,
    requestsPerTopUp: 64,
  };
}

/** The sizes a lease that took `taken` admissions over `overMs` gets: its top-up, and when it starts. */
function sized(taken: number, overMs: number): { requestsPerTopUp: number; refillBelowRequests: number } {
  const now = 1_000_000;
  const lease = leaseThatTook(taken, overMs, now);
  sizeByRate(lease, now);
  return { requestsPerTopUp: lease.requestsPerTopUp, refillBelowRequests: refillBelowRequests(lease) };
}

describe('sizing a wallet lease by its rate', () => {
  it('keeps 64 shares refilled at 16 for a wallet below 640 admissions a second', () => {
    expect(sized(0, 1000)).toMatchObject({ requestsPerTopUp: 64, refillBelowRequests: 16 });
    expect(sized(64, 1000)).toMatchObject({ requestsPerTopUp: 64, refillBelowRequests: 16 });
    expect(sized(640, 1000)).toMatchObject({ requestsPerTopUp: 64, refillBelowRequests: 16 });
  });

  it('covers 100 ms of a fast wallet and refills it with 25 ms left: 6,000 a second → 600 shares, refilled at 150', () => {
    expect(sized(600, 100)).toMatchObject({ requestsPerTopUp: 600, refillBelowRequests: 150 });
  });

  it('never asks for more than 4,096 shares, however fast the admissions came', () => {
    expect(sized(1_000_000, 0)).toMatchObject({ requestsPerTopUp: 4096, refillBelowRequests: 1024 });
  });

  it('starts counting anew from the top-up', () => {
    const now = 1_000_000;
    const lease = leaseThatTook(500, 50, now);
    sizeByRate(lease, now);
    expect(lease).toMatchObject({ takenSinceTopUp: 0, topUpStartedAt: now });
  });

  it('for any rate: within the bounds, refilled at a quarter of a top-up (so a fresh one is never due again), and never smaller for a faster wallet', () => {
    fc.assert(
      fc.property(fc.nat(2_000_000), fc.nat(60_000), fc.nat(2_000_000), (taken, overMs, more) => {
        const lease = sized(taken, overMs);
        expect(lease.requestsPerTopUp).toBeGreaterThanOrEqual(64);
        expect(lease.requestsPerTopUp).toBeLessThanOrEqual(4096);
        expect(lease.refillBelowRequests).toBeGreaterThanOrEqual(16);
        expect(lease.refillBelowRequests * 4).toBeLessThanOrEqual(lease.requestsPerTopUp + 3);
        const faster = sized(taken + more, overMs);
        expect(faster.requestsPerTopUp).toBeGreaterThanOrEqual(lease.requestsPerTopUp);
        expect(faster.refillBelowRequests).toBeGreaterThanOrEqual(lease.refillBelowRequests);
      }),
    );
  });
});
