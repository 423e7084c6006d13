import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/ids.ts';
import type { BillingContext } from '../../src/ledger/billing.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { ADMIT_JOB, admitInTransaction, admitRequest, type AdmitInput, type AdmitOutcome } from '../../src/ledger/admission/admit.ts';
import { holdParts, refusedPart } from '../../src/ledger/decide/admission.ts';
import { HoldKeeper } from '../../src/ledger/hold-keeper.ts';
import { WalletLeases } from '../../src/ledger/leases.ts';
import { formatMoney } from '../../src/domain/money.ts';
import { admitDeferred, deferredWrites, type DeferredAdmission } from '../../src/ledger/admission/deferred.ts';
import { GroupCommitWriter } from '../../src/ledger/group-commit.ts';
import { placeHold } from '../../src/ledger/holds.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { CHAT_FACTS } from '../helpers/settle.ts';
import { until } from '../helpers/until.ts';

/**
 * Admission has one reference, the in-transaction path (a group-commit batch decided member by
 * member under row locks). Each other path must decide exactly as it does, on random wallets
 * (balances, holds already placed), a random spend key of the merchant's (spend and request
 * limits) and random batches of requests arriving together:
 * - alone (a member of a failed batch, admitRequest): the same outcome for every request, spend-key
 *   refusals included, and the same `held` and key counters;
 * - one statement (PostgreSQL): admits a batch only when the reference admits every member, and
 *   then holds the same amounts; otherwise (and whenever a spend key is in it) it writes nothing and
 *   leaves the batch to the reference;
 * - deferred in process (the embedded shape, SQLite): the same outcome for every request, in order, and
 *   once its writes land the same `held` on every wallet;
 * - from leases (PostgreSQL's hot wallets): the same outcome for every request, in order, and once
 *   its writes land and the leases are given back the same `held`;
 * - concurrent requests (deferred, or from leases): never more admitted on a wallet than it had
 *   available, and every refusal one the wallet could not have covered after what was admitted.
 * Some wallets are overrun (decisions 0019, 0025): every path counts what their holds in flight and
 * the new one may overrun at the wallet's recorded rate, and ends the overrun with the admission
 * that finds nothing held.
 */

/** Payers: 0 the merchant's own wallet, 1 and 2 two customers' wallets (customers' fees also hold on the merchant's). */
type Payer = 0 | 1 | 2;
/** `overrun`: its settled charges exceeded their holds by OVERRUN_RATE per thousand (decision 0025). */
type WalletSpec = { balance: bigint; held: bigint; overrun: boolean };
/** High enough that the overrun bound refuses many requests a wallet's balance would cover. */
const OVERRUN_RATE = 1_500;
/** `spendKey`: the merchant's own request made with its spend key (payer 0 only). */
type RequestSpec = { payer: Payer; wallet: bigint; merchant: bigint; spendKey: boolean };
/** The merchant's spend key: its spend limit (units of 0.001) and request limit, null for none. */
type KeySpec = { spendLimit: number | null; requestLimit: number | null };
type Scenario = { wallets: [WalletSpec, WalletSpec, WalletSpec]; key: KeySpec; requests: RequestSpec[] };

const UNIT = 10_000_000n; // 0.001
const amount = fc.integer({ min: 0, max: 12 }).map((n) => BigInt(n) * UNIT);
const walletSpec = fc
  .record({ balance: amount, held: amount, overrun: fc.boolean() })
  .map(({ balance, held, overrun }) => ({ balance, held: held > balance ? balance : held, overrun }));
const request = fc
  .record({ payer: fc.constantFrom<Payer>(0, 1, 2), wallet: amount, merchant: amount, spendKey: fc.boolean() })
  .map((r) => ({ ...r, spendKey: r.spendKey && r.payer === 0 }));
const keySpec: fc.Arbitrary<KeySpec> = fc.record({
  spendLimit: fc.option(fc.integer({ min: 1, max: 30 }), { nil: null }),
  requestLimit: fc.option(fc.integer({ min: 1, max: 6 }), { nil: null }),
});
const scenario: fc.Arbitrary<Scenario> = fc.record({
  wallets: fc.tuple(walletSpec, walletSpec, walletSpec),
  key: keySpec,
  requests: fc.array(request, { minLength: 1, maxLength: 8 }),
});
/** Without spend keys: the paths that take no spend-key request (deferred, leases). */
const plainScenario = scenario.map((s) => ({ ...s, requests: s.requests.map((r) => ({ ...r, spendKey: false })) }));
/** Nor overrun wallets. */
const notOverrun = plainScenario.map((s) => ({ ...s, wallets: s.wallets.map((w) => ({ ...w, overrun: false })) as Scenario['wallets'] }));

type World = {
  walletIds: [string, string, string];
  billings: [BillingContext, BillingContext, BillingContext];
  /** The merchant's request made with its spend key. */
  keyBilling: BillingContext;
};
type Decision = string;

const decisionOf = (outcome: AdmitOutcome): Decision =>
  outcome.outcome === 'admitted'
    ? 'admitted'
    : outcome.outcome === 'insufficient_balance'
      ? `insufficient_balance:${outcome.payer}`
      : `spend_key_refused:${outcome.refusal.code}`;

describe.each(databasesUnderTest())('every admission path decides as the in-transaction reference, on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => {
    await t?.close();
  });

  /** A fresh merchant with a spend key and two of its customers (on one meter), whose wallets are as the scenario says. */
  async function world(wallets: Scenario['wallets'], key: KeySpec = { spendLimit: null, requestLimit: null }): Promise<World> {
    const merchant = await t.newMerchant('Property');
    const headers = t.auth(merchant.secretKey);
    const meter = (await t.app.inject({ method: 'POST', url: '/v1/meters', headers, payload: { name: 'Chat', rate_type: 'fixed', tiers: [{ start: 0, rate: '0.001' }] } })).json();
    const customers = [];
    for (let i = 0; i < 2; i++) customers.push((await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json());
    const walletIds: World['walletIds'] = [merchant.walletId, customers[0].wallet.wallet_id, customers[1].wallet.wallet_id];
    const credentials = [
      merchant.secretKey,
      ...customers.map((c) => forwardToken(merchant.secretKey, c.customer_id, meter.meter_slug)),
    ];
    const billings = (await Promise.all(credentials.map((credential) => resolveForwardCredential(t.storage, credential, new Date())))) as World['billings'];
    const limits = {
      ...(key.spendLimit === null ? {} : { spend_limit: { amount: formatMoney(BigInt(key.spendLimit) * UNIT), cycle: 'daily' } }),
      ...(key.requestLimit === null ? {} : { request_limit: { count: key.requestLimit, cycle: 'daily' } }),
    };
    const spendKey = (await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers, payload: { name: 'property', ...limits } })).json<{ key: string }>();
    const keyBilling = await resolveForwardCredential(t.storage, spendKey.key, new Date());
    for (const [i, spec] of wallets.entries()) {
      if (spec.balance > 0n) await creditWallet(t.storage, walletIds[i]!, spec.balance, new Date().toISOString());
      if (spec.overrun) await t.storage.db.updateTable('wallets').set({ overrun: OVERRUN_RATE }).where('id', '=', walletIds[i]!).execute();
      if (spec.held === 0n) continue;
      const placed = await placeHold(t.storage, { now: new Date(), walletId: walletIds[i]!, amount: spec.held, reference: newId('request'), ttlMs: 3_600_000 });
      if (!('holdId' in placed)) throw new Error('could not place the scenario hold');
    }
    return { walletIds, billings, keyBilling };
  }

  function inputsOf(w: World, requests: RequestSpec[]): AdmitInput[] {
    return requests.map((r) => {
      const billing = r.spendKey ? w.keyBilling : w.billings[r.payer];
      // A merchant's own request holds everything on its wallet.
      const walletId = w.walletIds[r.payer];
      return {
        requestId: newId('request'),
        billing,
        walletId,
        estimate: { wallet: r.wallet, merchant: r.merchant },
        ttlMs: 3_600_000,
        record: { ...CHAT_FACTS, model: 'gpt-4o' },
        now: new Date(),
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
  const keyCountersOf = async (w: World) => {
    const key = await t.storage.db.selectFrom('spend_keys').select(['current_requests', 'reserved_spend']).where('id', '=', w.keyBilling.spendKey!.id).executeTakeFirstOrThrow();
    return { requests: BigInt(key.current_requests), reserved: BigInt(key.reserved_spend) };
  };

  async function reference(s: Scenario) {
    const w = await world(s.wallets, s.key);
    const outcomes = await t.storage.db.transaction().execute((trx) => admitInTransaction(trx, dialect, inputsOf(w, s.requests)));
    return { decisions: outcomes.map(decisionOf), held: await heldOf(w), key: await keyCountersOf(w) };
  }

  it('alone (a member of a failed batch): the same decision for every request, spend-key limits included, and the same holds and key counters', async () => {
    await fc.assert(
      fc.asyncProperty(scenario, async (s) => {
        const expected = await reference(s);
        const w = await world(s.wallets, s.key);
        const decisions: Decision[] = [];
        for (const input of inputsOf(w, s.requests)) decisions.push(decisionOf(await admitRequest(t.storage, input)));
        expect(decisions).toEqual(expected.decisions);
        expect(await heldOf(w)).toEqual(expected.held);
        expect(await keyCountersOf(w)).toEqual(expected.key);
      }),
      { numRuns: 10 },
    );
  });

  it.runIf(dialect === 'sqlite')('deferred in-process admission: the same decision for every request and the same holds once written', async () => {
    await fc.assert(
      fc.asyncProperty(plainScenario, async (s) => {
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
        const w = await world(s.wallets, s.key);
        const before = await heldOf(w);
        const fast = await ADMIT_JOB.wholeBatch!(t.storage, inputsOf(w, s.requests));
        const referenceAdmitsAll = expected.decisions.every((d) => d === 'admitted');
        const anyHold = s.requests.some((r) => r.wallet > 0n || r.merchant > 0n);
        const anySpendKey = s.requests.some((r) => r.spendKey);
        // With nothing to hold it leaves the batch to the reference (nothing to lock or check), and
        // a spend key's limits are only ever decided on its locked row.
        expect(fast !== null).toBe(referenceAdmitsAll && anyHold && !anySpendKey);
        if (fast) {
          expect(fast.map(decisionOf)).toEqual(expected.decisions);
          expect(await heldOf(w)).toEqual(expected.held);
        } else expect(await heldOf(w)).toEqual(before);
      }),
      { numRuns: 12 },
    );
  });

  it.runIf(dialect === 'postgres')('from leases: the same decision for every request, in order, and the same holds once written and the leases given back', async () => {
    await fc.assert(
      fc.asyncProperty(plainScenario, async (s) => {
        const expected = await reference(s);
        const w = await world(s.wallets);
        const writer = new GroupCommitWriter(t.storage);
        const keeper = new HoldKeeper(t.storage, 3_600_000, t.app.log, t.clock);
        const leases = new WalletLeases(t.storage, keeper, { hotAfter: 0, idleMs: 600_000, ttlMs: 3_600_000 }, t.app.log, t.clock);
        const deferred = deferredWrites(writer);
        const decisions: Decision[] = [];
        const writes: Promise<void>[] = [];
        try {
          for (const input of inputsOf(w, s.requests)) {
            const outcome = await admitDeferred(t.storage, deferred, input, leases);
            decisions.push(decisionOf(outcome));
            if (outcome.outcome === 'admitted' && outcome.deferred) writes.push(outcome.deferred.written);
          }
          await Promise.all(writes);
          await writer.drain();
        } finally {
          await leases.close();
          await keeper.close();
        }
        expect(decisions).toEqual(expected.decisions);
        // Held the same; an overrun may have ended where the reference's stays: a request's leases are
        // topped up wallet by wallet before any part is taken, so one topped up on an overrun wallet
        // with nothing in flight ends its overrun even when the request is then refused on its other
        // wallet (the rule holds: nothing was in flight).
        const held = await heldOf(w);
        expect(held.map((wallet) => wallet.held)).toEqual(expected.held.map((wallet) => wallet.held));
        held.forEach((wallet, i) => {
          if (wallet.overrun !== 0) expect(expected.held[i]!.overrun).not.toBe(0);
        });
      }),
      { numRuns: 10 },
    );
  });

  it.runIf(dialect === 'postgres')("from leases, a request refused on its other wallet takes nothing: a concurrent request on the wallet they share is admitted, as the reference admits it", async () => {
    const s = refusedOnItsOtherWallet;
    const expected = await reference(s);
    expect(expected.decisions).toEqual(['insufficient_balance:merchant', 'admitted']);
    const w = await world(s.wallets);
    const [both, customerOnly] = inputsOf(w, s.requests);
    const writer = new GroupCommitWriter(t.storage);
    const keeper = new HoldKeeper(t.storage, 3_600_000, t.app.log, t.clock);
    const leases = new WalletLeases(t.storage, keeper, { hotAfter: 0, idleMs: 600_000, ttlMs: 3_600_000 }, t.app.log, t.clock);
    const deferred = deferredWrites(writer);
    // The merchant's wallet row is locked elsewhere: the first request's top-up there waits, after
    // it has opened the customer's lease.
    let unlock!: () => void;
    const locked = new Promise<void>((resolve) => (unlock = resolve));
    let lockTaken!: () => void;
    const lockHeld = new Promise<void>((resolve) => (lockTaken = resolve));
    const lock = t.storage.db.transaction().execute(async (trx) => {
      await trx.selectFrom('wallets').select('id').where('id', '=', w.walletIds[0]).forUpdate().execute();
      lockTaken();
      await locked;
    });
    try {
      await lockHeld;
      const first = admitDeferred(t.storage, deferred, both!, leases);
      const customerLease = () =>
        t.storage.db.selectFrom('holds').select('id').where('wallet_id', '=', w.walletIds[1]).whereRef('reference', '=', 'id').where('status', '=', 'active').executeTakeFirst();
      await until(customerLease, "the customer's lease to open");
      // The customer's lease is open and the first request waits on the merchant's wallet.
      const second = await admitDeferred(t.storage, deferred, customerOnly!, leases);
      unlock();
      const decisions = [decisionOf(await first), decisionOf(second)];
      if (second.outcome === 'admitted' && second.deferred) await second.deferred.written;
      await writer.drain();
      expect(decisions).toEqual(expected.decisions);
    } finally {
      unlock();
      await lock;
      await leases.close();
      await keeper.close();
    }
    expect((await heldOf(w)).map((wallet) => wallet.held)).toEqual(expected.held.map((wallet) => wallet.held));
  });

  it('concurrent requests (deferred in process, or from leases): never more admitted than available, every refusal justified', async () => {
    await fc.assert(
      // Without overruns: which of the concurrent requests ends one is a matter of arrival (the
      // in-order properties above cover overruns).
      fc.asyncProperty(notOverrun, async (s) => {
        const w = await world(s.wallets);
        const available = await Promise.all(w.walletIds.map(async (id) => { const row = (await findWallet(t.storage, id))!; return row.balance - row.held; }));
        const writer = new GroupCommitWriter(t.storage);
        const keeper = new HoldKeeper(t.storage, 3_600_000, t.app.log, t.clock);
        const leases = dialect === 'postgres' ? new WalletLeases(t.storage, keeper, { hotAfter: 0, idleMs: 600_000, ttlMs: 3_600_000 }, t.app.log, t.clock) : undefined;
        const deferred = deferredWrites(writer);
        const inputs = inputsOf(w, s.requests);
        let outcomes: DeferredAdmission[];
        try {
          outcomes = await Promise.all(inputs.map((input) => admitDeferred(t.storage, deferred, input, leases)));
          await Promise.all(outcomes.flatMap((o) => (o.outcome === 'admitted' && o.deferred ? [o.deferred.written] : [])));
          await writer.drain();
        } finally {
          await leases?.close();
          await keeper.close();
        }
        const admittedOn = w.walletIds.map(() => 0n);
        const partsOf = (input: AdmitInput) => holdParts(input.walletId, input.billing.merchantWalletId, input.estimate);
        outcomes.forEach((o, i) => {
          if (o.outcome !== 'admitted') return;
          for (const part of partsOf(inputs[i]!)) admittedOn[w.walletIds.indexOf(part.walletId as never)]! += part.amount;
        });
        admittedOn.forEach((sum, i) => {
          if (sum > 0n) expect(sum).toBeLessThanOrEqual(available[i]!);
        });
        // From leases too, a request's parts are taken all at once or not at all: a request refused on
        // one wallet never holds its other wallet's lease, even for a moment, so every refusal is
        // justified by what was admitted alone.
        outcomes.forEach((o, i) => {
          if (o.outcome !== 'insufficient_balance') return;
          const own = partsOf(inputs[i]!);
          const left = (walletId: string) => {
            const at = w.walletIds.indexOf(walletId as never);
            return available[at]! - admittedOn[at]!;
          };
          expect(refusedPart(own, left)).toBeDefined();
        });
        // Everything admitted is held once written (the leases were given back).
        expect((await heldOf(w)).map((wallet) => wallet.held)).toEqual(w.walletIds.map((_, i) => s.wallets[i]!.held + admittedOn[i]!));
      }),
      { numRuns: 10, examples: [[refusedOnItsOtherWallet]] },
    );
  });
});

/**
 * A customer's wallet that covers one request, and two requests on it arriving together: the first
 * also needs the merchant's wallet, which is empty, and is refused there; the second needs only the
 * customer's, so the reference admits it. Taken wallet by wallet, the first would hold the
 * customer's lease while the merchant's top-up failed, and the second would be refused.
 */
const refusedOnItsOtherWallet: Scenario = {
  wallets: [
    { balance: 0n, held: 0n, overrun: false },
    { balance: 5n * UNIT, held: 0n, overrun: false },
    { balance: 0n, held: 0n, overrun: false },
  ],
  key: { spendLimit: null, requestLimit: null },
  requests: [
    { payer: 1, wallet: 5n * UNIT, merchant: 5n * UNIT, spendKey: false },
    { payer: 1, wallet: 5n * UNIT, merchant: 0n, spendKey: false },
  ],
};
