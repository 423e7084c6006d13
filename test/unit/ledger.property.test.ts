import fc from 'fast-check';
import type { Transaction } from 'kysely';
import { describe, expect, it } from 'vitest';
import {
  BUCKET_ORDER,
  creditGrantsAccount,
  merchantRevenueAccount,
  operatorFundingAccount,
  parseWalletAccount,
  providerCostsAccount,
  serviceChargesAccount,
  walletAccount,
  type Bucket,
} from '../../src/ledger/accounts.ts';
import { UnbalancedTransactionError, type Leg } from '../../src/ledger/postings.ts';
import { appendTransaction } from '../../src/ledger/store/common.ts';
import { saveBalance, type WalletRow } from '../../src/ledger/wallets.ts';
import { availableFor, debitInMemory, splitDebit } from '../../src/ledger/decide/balance.ts';
import type { Database } from '../../src/storage/schema.ts';

/**
 * The ledger's arithmetic, without a database: a transaction that records what was inserted and
 * updated stands in for Kysely's, so thousands of random grant/charge sequences run in milliseconds.
 */

type Posting = { transaction_id: string; account: string; amount: bigint };

function recordingTransaction() {
  const transactions: { id: string; kind: string }[] = [];
  const postings: Posting[] = [];
  const walletUpdates: { id: unknown; values: Record<string, unknown> }[] = [];
  const trx = {
    insertInto: (table: string) => ({
      values: (values: unknown) => ({
        execute: async () => {
          const rows = (Array.isArray(values) ? values : [values]) as Record<string, unknown>[];
          if (table === 'ledger_transactions') transactions.push(...(rows as { id: string; kind: string }[]));
          else if (table === 'ledger_postings') postings.push(...(rows as Posting[]));
          else throw new Error(`unexpected insert into ${table}`);
          return [];
        },
      }),
    }),
    updateTable: (table: string) => ({
      set: (values: Record<string, unknown>) => ({
        where: (column: string, op: string, id: unknown) => ({
          execute: async () => {
            if (table !== 'wallets' || column !== 'id' || op !== '=') throw new Error(`unexpected update of ${table}`);
            walletUpdates.push({ id, values });
            return [];
          },
        }),
      }),
    }),
  };
  return { trx: trx as unknown as Transaction<Database>, transactions, postings, walletUpdates };
}

const AT = '2025-01-01T00:00:00.000Z';
const MERCHANT = 'mer_test';
const MAX = 10n ** 14n;

function wallet(buckets: { cycle: bigint; bundle: bigint; prepaid: bigint }): WalletRow {
  return {
    id: 'wal_test',
    merchant_id: MERCHANT,
    owner_type: 'connection',
    balance: buckets.cycle + buckets.bundle + buckets.prepaid,
    cycle_credit: buckets.cycle,
    bundle_credit: buckets.bundle,
    held: 0n,
    created_at: AT,
  };
}

const sum = (amounts: readonly bigint[]) => amounts.reduce((a, b) => a + b, 0n);
const min = (a: bigint, b: bigint) => (a < b ? a : b);

const bucketsArb = fc.record({
  cycle: fc.bigInt({ min: 0n, max: MAX }),
  bundle: fc.bigInt({ min: 0n, max: MAX }),
  // Prepaid may already be below zero: a settled request may have cost more than its hold.
  prepaid: fc.bigInt({ min: -MAX, max: MAX }),
});

describe('splitDebit', () => {
  it('usage that draws plan credit takes cycle, then bundle, then prepaid; never more than cycle or bundle hold; parts sum to the amount', () => {
    fc.assert(
      fc.property(bucketsArb, fc.bigInt({ min: 0n, max: 4n * MAX }), (buckets, amount) => {
        const w = wallet(buckets);
        const before = { ...w };
        const split = splitDebit(w, amount, true);
        expect(w).toEqual(before); // pure: the row is not touched
        expect(split.cycle + split.bundle + split.prepaid).toBe(amount);
        for (const bucket of BUCKET_ORDER) expect(split[bucket] >= 0n).toBe(true);
        // In order, each bucket as far as it goes…
        expect(split.cycle).toBe(min(amount, buckets.cycle));
        expect(split.bundle).toBe(min(amount - split.cycle, buckets.bundle));
        // …and only prepaid may be taken past what it holds.
        expect(split.cycle <= buckets.cycle && split.bundle <= buckets.bundle).toBe(true);
        if (split.bundle > 0n) expect(split.cycle).toBe(buckets.cycle);
        if (split.prepaid > 0n) expect([split.cycle, split.bundle]).toEqual([buckets.cycle, buckets.bundle]);
      }),
      { numRuns: 2000 },
    );
  });

  it('usage that may not draw plan credit takes all of it from prepaid, whatever cycle and bundle credit the wallet has', () => {
    fc.assert(
      fc.property(bucketsArb, fc.bigInt({ min: 0n, max: 4n * MAX }), (buckets, amount) => {
        expect(splitDebit(wallet(buckets), amount, false)).toEqual({ cycle: 0n, bundle: 0n, prepaid: amount });
      }),
      { numRuns: 500 },
    );
  });

  it('takes a zero amount from nowhere', () => {
    fc.assert(
      fc.property(bucketsArb, fc.boolean(), (buckets, drawsPlanCredit) => {
        expect(splitDebit(wallet(buckets), 0n, drawsPlanCredit)).toEqual({ cycle: 0n, bundle: 0n, prepaid: 0n });
      }),
    );
  });
});

describe('appendTransaction', () => {
  const account = fc.constantFrom(
    walletAccount('wal_a', 'prepaid'),
    walletAccount('wal_a', 'cycle'),
    merchantRevenueAccount(MERCHANT),
    providerCostsAccount(MERCHANT),
    serviceChargesAccount(),
  );
  const legArb = fc.record({ account, amount: fc.bigInt({ min: -MAX, max: MAX }) });

  it('refuses legs that do not sum to zero, writing nothing', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(legArb, { maxLength: 6 }), fc.bigInt({ min: -MAX, max: MAX }).filter((x) => x !== 0n), async (legs, off) => {
        // Balance the legs, then put them off by a non-zero amount.
        const unbalanced: Leg[] = [...legs, { account: operatorFundingAccount(), amount: -sum(legs.map((l) => l.amount)) + off }];
        const rec = recordingTransaction();
        const attempt = appendTransaction(rec.trx, { kind: 'test', merchantId: MERCHANT, legs: unbalanced, at: AT });
        await expect(attempt).rejects.toBeInstanceOf(UnbalancedTransactionError);
        await expect(appendTransaction(rec.trx, { kind: 'test', merchantId: MERCHANT, legs: unbalanced, at: AT })).rejects.toThrow(
          `off by ${off}`,
        );
        expect(rec.transactions).toEqual([]);
        expect(rec.postings).toEqual([]);
      }),
      { numRuns: 300 },
    );
  });

  it('writes a balanced transaction once, with every non-zero leg and no zero leg', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(legArb, { maxLength: 6 }), async (legs) => {
        const balanced: Leg[] = [...legs, { account: operatorFundingAccount(), amount: -sum(legs.map((l) => l.amount)) }];
        const rec = recordingTransaction();
        const id = await appendTransaction(rec.trx, { kind: 'test', merchantId: MERCHANT, reference: 'r', legs: balanced, at: AT });
        expect(rec.transactions).toHaveLength(1);
        expect(rec.transactions[0]?.id).toBe(id);
        expect(rec.postings.every((p) => p.transaction_id === id && p.amount !== 0n)).toBe(true);
        expect(rec.postings.map((p) => [p.account, p.amount])).toEqual(balanced.filter((l) => l.amount !== 0n).map((l) => [l.account, l.amount]));
        expect(sum(rec.postings.map((p) => p.amount))).toBe(0n);
      }),
      { numRuns: 300 },
    );
  });
});

type Op =
  | { type: 'grant'; bucket: Bucket; amount: bigint }
  | { type: 'charge'; base: bigint; fee: bigint; serviceCharge: bigint; settlesHold: boolean; drawsPlanCredit: boolean };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({
    type: fc.constant('grant' as const),
    bucket: fc.constantFrom<Bucket>('cycle', 'bundle', 'prepaid'),
    amount: fc.bigInt({ min: 1n, max: MAX }),
  }),
  fc.record({
    type: fc.constant('charge' as const),
    base: fc.bigInt({ min: 0n, max: MAX }),
    fee: fc.bigInt({ min: 0n, max: MAX }),
    serviceCharge: fc.bigInt({ min: 0n, max: MAX / 10n }),
    // A settlement against a hold may exceed the balance; a plain charge is refused instead.
    settlesHold: fc.boolean(),
    drawsPlanCredit: fc.boolean(),
  }),
);

describe('grants and charges through debitInMemory, saveBalance and appendTransaction', () => {
  it('keep every transaction balanced and the wallet row equal to its postings, bucket by bucket', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(opArb, { maxLength: 40 }), async (ops) => {
        const rec = recordingTransaction();
        const w = wallet({ cycle: 0n, bundle: 0n, prepaid: 0n });
        let charged = 0n;

        for (const op of ops) {
          const transactionsBefore = rec.transactions.length;
          const postingsBefore = rec.postings.length;
          if (op.type === 'grant') {
            // As grantCredit (prepaid) or a subscription / bundle grant would: column and legs together.
            w.balance += op.amount;
            if (op.bucket === 'cycle') w.cycle_credit += op.amount;
            if (op.bucket === 'bundle') w.bundle_credit += op.amount;
            await appendTransaction(rec.trx, {
              kind: 'credit_grant',
              merchantId: MERCHANT,
              legs: [
                { account: walletAccount(w.id, op.bucket), amount: op.amount },
                { account: creditGrantsAccount(MERCHANT), amount: -op.amount },
              ],
              at: AT,
            });
          } else {
            const total = op.base + op.fee + op.serviceCharge;
            if (!op.settlesHold && availableFor(w, null, op.drawsPlanCredit) < total) continue; // refused: nothing written
            const before = { ...w };
            const expectedSplit = splitDebit(before, total, op.drawsPlanCredit);
            // As every charge posts (postCharge): the debit in memory, the row written back when it moved.
            const legs = debitInMemory(w, total, op.drawsPlanCredit);
            if (legs.length > 0) await saveBalance(rec.trx, w);
            // The row is updated in memory and in the database alike, by the split.
            expect(w.balance).toBe(before.balance - total);
            expect(w.cycle_credit).toBe(before.cycle_credit - expectedSplit.cycle);
            expect(w.bundle_credit).toBe(before.bundle_credit - expectedSplit.bundle);
            if (total > 0n) {
              expect(rec.walletUpdates.at(-1)).toEqual({
                id: w.id,
                values: { balance: w.balance, cycle_credit: w.cycle_credit, bundle_credit: w.bundle_credit },
              });
            } else {
              expect(legs).toEqual([]);
            }
            expect(sum(legs.map((l) => l.amount))).toBe(-total);
            await appendTransaction(rec.trx, {
              kind: 'request_charge',
              merchantId: MERCHANT,
              legs: [
                ...legs,
                { account: providerCostsAccount(MERCHANT), amount: op.base },
                { account: merchantRevenueAccount(MERCHANT), amount: op.fee },
                { account: serviceChargesAccount(), amount: op.serviceCharge },
              ],
              at: AT,
            });
            charged += total;
          }
          // One transaction per change, and it sums to zero.
          expect(rec.transactions.length).toBe(transactionsBefore + 1);
          const id = rec.transactions.at(-1)!.id;
          const added = rec.postings.slice(postingsBefore);
          expect(added.every((p) => p.transaction_id === id)).toBe(true);
          expect(sum(added.map((p) => p.amount))).toBe(0n);

          // Invariants of the wallet after every step.
          expect(w.cycle_credit >= 0n && w.bundle_credit >= 0n).toBe(true);
          const rebuilt: Record<Bucket, bigint> = { cycle: 0n, bundle: 0n, prepaid: 0n };
          for (const p of rec.postings) {
            const parsed = parseWalletAccount(p.account);
            if (parsed) rebuilt[parsed.bucket] += p.amount;
          }
          expect(rebuilt.cycle).toBe(w.cycle_credit);
          expect(rebuilt.bundle).toBe(w.bundle_credit);
          expect(rebuilt.cycle + rebuilt.bundle + rebuilt.prepaid).toBe(w.balance);
        }
        // Money is conserved: everything granted is either still in the wallet or was charged.
        const granted = sum(ops.flatMap((op) => (op.type === 'grant' ? [op.amount] : [])));
        expect(w.balance).toBe(granted - charged);
        expect(sum(rec.postings.map((p) => p.amount))).toBe(0n);
      }),
      { numRuns: 300 },
    );
  });
});
