import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/ids.ts';
import type { BillingContext } from '../../src/ledger/billing.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { ADMIT_JOB, admitInTransaction, type AdmitInput, type AdmitOutcome } from '../../src/ledger/admission/admit.ts';
import { admitDeferred, deferredWrites } from '../../src/ledger/admission/deferred.ts';
import { GroupCommitWriter } from '../../src/ledger/group-commit.ts';
import { placeHold } from '../../src/ledger/holds.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { CHAT_FACTS } from '../helpers/settle.ts';

/**
 * Admission has one reference, the in-transaction path (a group-commit batch decided member by
 * member under row locks). Each fast path must decide exactly as it does, on random wallets
 * (balances, holds already placed) and random batches of requests arriving together:
 * - one statement (PostgreSQL): admits a batch only when the reference admits every member, and
 *   then holds the same amounts; otherwise it writes nothing and leaves the batch to the reference;
 * - deferred in process (the embedded shape, SQLite): the same outcome for every request, in order, and
 *   once its writes land the same `held` on every wallet.
 * Some wallets are overrun (decision 0019): every path refuses them while anything is held on them,
 * and ends the overrun with the admission that finds nothing held.
 */

/** Payers: 0 the merchant's own wallet, 1 and 2 two customers' wallets (customers' fees also hold on the merchant's). */
type Payer = 0 | 1 | 2;
/** `overrun`: its settled charges exceeded their holds (decision 0019): nothing is admitted while anything is held. */
type WalletSpec = { balance: bigint; held: bigint; overrun: boolean };
type RequestSpec = { payer: Payer; wallet: bigint; merchant: bigint };
type Scenario = { wallets: [WalletSpec, WalletSpec, WalletSpec]; requests: RequestSpec[] };

const UNIT = 10_000_000n; // 0.001
const amount = fc.integer({ min: 0, max: 12 }).map((n) => BigInt(n) * UNIT);
const walletSpec = fc
  .record({ balance: amount, held: amount, overrun: fc.boolean() })
  .map(({ balance, held, overrun }) => ({ balance, held: held > balance ? balance : held, overrun }));
const scenario: fc.Arbitrary<Scenario> = fc.record({
  wallets: fc.tuple(walletSpec, walletSpec, walletSpec),
  requests: fc.array(
    fc.record({ payer: fc.constantFrom<Payer>(0, 1, 2), wallet: amount, merchant: amount }),
    { minLength: 1, maxLength: 8 },
  ),
});

type World = { walletIds: [string, string, string]; billings: [BillingContext, BillingContext, BillingContext] };
type Decision = 'admitted' | 'insufficient_balance:wallet' | 'insufficient_balance:merchant';

const decisionOf = (outcome: AdmitOutcome): Decision =>
  outcome.outcome === 'admitted' ? 'admitted' : outcome.outcome === 'insufficient_balance' ? `insufficient_balance:${outcome.payer}` : (() => {
    throw new Error(`unexpected ${outcome.outcome}`);
  })();

describe.each(databasesUnderTest())('every admission path decides as the in-transaction reference, on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => {
    await t?.close();
  });

  /** A fresh merchant and two of its customers (on one meter), whose wallets are as the scenario says. */
  async function world(wallets: Scenario['wallets']): Promise<World> {
    const merchant = await t.newMerchant('Property');
    const headers = t.auth(merchant.secretKey);
    const meter = (await t.app.inject({ method: 'POST', url: '/v1/meters', headers, payload: { name: 'Chat', rate_type: 'fixed', tiers: [{ start: 0, rate: '0.001' }] } })).json();
    const customers = [];
    for (let i = 0; i < 2; i++) customers.push((await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json());
    const walletIds: World['walletIds'] = [merchant.walletId, customers[0].wallet.wallet_id, customers[1].wallet.wallet_id];
    const credentials = [
      merchant.secretKey,
      ...customers.map((c) => Buffer.from(JSON.stringify({ secret_key: merchant.secretKey, customer_id: c.customer_id, meter_slug: meter.meter_slug })).toString('base64')),
    ];
    const billings = (await Promise.all(credentials.map((credential) => resolveForwardCredential(t.storage, credential, new Date())))) as World['billings'];
    for (const [i, spec] of wallets.entries()) {
      if (spec.balance > 0n) await creditWallet(t.storage, walletIds[i]!, spec.balance);
      if (spec.overrun) await t.storage.db.updateTable('wallets').set({ overrun: 1 }).where('id', '=', walletIds[i]!).execute();
      if (spec.held === 0n) continue;
      const placed = await placeHold(t.storage, { walletId: walletIds[i]!, amount: spec.held, reference: newId('request'), ttlMs: 3_600_000 });
      if (!('holdId' in placed)) throw new Error('could not place the scenario hold');
    }
    return { walletIds, billings };
  }

  function inputsOf(w: World, requests: RequestSpec[]): AdmitInput[] {
    return requests.map((r) => {
      const billing = w.billings[r.payer];
      // A merchant's own request holds everything on its wallet.
      const walletId = w.walletIds[r.payer];
      return {
        requestId: newId('request'),
        billing,
        walletId,
        estimate: { wallet: r.wallet, merchant: r.merchant },
        ttlMs: 3_600_000,
        record: { ...CHAT_FACTS, model: 'gpt-4o' },
      };
    });
  }

  /** Each wallet's `held` and whether it is still overrun. */
  const heldOf = async (w: World) =>
    Promise.all(
      w.walletIds.map(async (id) => {
        const wallet = (await findWallet(t.storage, id))!;
        return { held: wallet.held, overrun: Number(wallet.overrun) };
      }),
    );

  async function reference(s: Scenario) {
    const w = await world(s.wallets);
    const outcomes = await t.storage.db.transaction().execute((trx) => admitInTransaction(trx, dialect, inputsOf(w, s.requests)));
    return { decisions: outcomes.map(decisionOf), held: await heldOf(w) };
  }

  it.runIf(dialect === 'sqlite')('deferred in-process admission: the same decision for every request and the same holds once written', async () => {
    await fc.assert(
      fc.asyncProperty(scenario, async (s) => {
        const expected = await reference(s);
        const w = await world(s.wallets);
        const writer = new GroupCommitWriter(t.storage);
        const deferred = deferredWrites(writer);
        const decisions: Decision[] = [];
        const writes: Promise<void>[] = [];
        for (const input of inputsOf(w, s.requests)) {
          const outcome = await admitDeferred(t.storage, deferred, input);
          decisions.push(decisionOf(outcome));
          if (outcome.outcome === 'admitted' && outcome.deferred) writes.push(outcome.deferred.written);
        }
        await Promise.all(writes);
        await writer.drain();
        expect(decisions).toEqual(expected.decisions);
        expect(await heldOf(w)).toEqual(expected.held);
      }),
      { numRuns: 12 },
    );
  });

  it.runIf(dialect === 'postgres')('one statement: admits a batch exactly when the reference admits all of it, holding the same', async () => {
    await fc.assert(
      fc.asyncProperty(scenario, async (s) => {
        const expected = await reference(s);
        const w = await world(s.wallets);
        const before = await heldOf(w);
        const fast = await ADMIT_JOB.inOneStatement!(t.storage, inputsOf(w, s.requests)).catch(() => null);
        const referenceAdmitsAll = expected.decisions.every((d) => d === 'admitted');
        const anyHold = s.requests.some((r) => r.wallet > 0n || r.merchant > 0n);
        // With nothing to hold it leaves the batch to the reference (nothing to lock or check).
        expect(fast !== null).toBe(referenceAdmitsAll && anyHold);
        if (fast) {
          expect(fast.map(decisionOf)).toEqual(expected.decisions);
          expect(await heldOf(w)).toEqual(expected.held);
        } else expect(await heldOf(w)).toEqual(before);
      }),
      { numRuns: 12 },
    );
  });
});
