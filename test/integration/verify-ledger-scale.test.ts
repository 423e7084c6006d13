import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyLedger, type LedgerProblem, type VerifyProgress } from '../../src/ledger/verify.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { databasesUnderTest, freshDatabase } from '../helpers/databases.ts';

const TRANSACTIONS = 100_000; // two postings each: 200k postings
const WALLETS = 1_200;
/** Large enough that a wallet's ~83 postings pass 2^53 and a plain double sum would be off. */
const BASE_AMOUNT = 7_000_000_000_000_000n;

describe.each(databasesUnderTest())('verify-ledger over a large ledger on %s', (dialect) => {
  let storage: Storage;

  beforeAll(async () => {
    storage = openStorage((await freshDatabase(dialect)).url, { poolSize: 2 });
    await migrateToLatest(storage);
    // The seed and the tampering below write postings directly; PostgreSQL's own triggers would
    // refuse the unbalanced one, and this proves the check that does not rely on them.
    if (dialect === 'postgres') await sql`alter table ledger_postings disable trigger user`.execute(storage.db);
    const { merchant } = await createMerchant(storage, { name: 'Scale' }, new Date().toISOString());
    await seed(storage, dialect, merchant.id);
  }, 120_000);
  afterAll(async () => storage?.close());

  it('verifies 200k postings over 1,200 wallets clean, in chunks, reporting progress', async () => {
    const progress: VerifyProgress[] = [];
    const result = await verifyLedger(storage, { onProgress: (p) => progress.push(p) });
    expect(result.problems).toEqual([]);
    expect(result.problemCount).toBe(0);
    expect(result.transactions).toBe(TRANSACTIONS);
    expect(result.wallets).toBe(WALLETS + 1); // the seed's plus the merchant's own
    // Several chunks of each kind (200k postings, 1,201 wallets), the counts never going back.
    expect(new Set(progress.map((p) => p.transactions)).size).toBeGreaterThanOrEqual(4);
    expect(new Set(progress.map((p) => p.wallets)).size).toBeGreaterThanOrEqual(3);
    expect(progress.at(-1)).toEqual({ transactions: result.transactions, wallets: result.wallets });
    for (let i = 1; i < progress.length; i++) {
      expect(progress[i]!.transactions).toBeGreaterThanOrEqual(progress[i - 1]!.transactions);
      expect(progress[i]!.wallets).toBeGreaterThanOrEqual(progress[i - 1]!.wallets);
    }
  }, 120_000);

  it('finds a tampered wallet balance and an unbalanced posting among them, as they are found', async () => {
    const wallet = 'wal_scale_0000777';
    await storage.db.updateTable('wallets').set({ balance: sql`balance + 1` }).where('id', '=', wallet).execute();
    const tx = 'ltx_scale_0054321';
    await storage.db
      .insertInto('ledger_postings')
      .values({ id: 'pst_tampered', transaction_id: tx, account: 'operator:funding', amount: -3n, created_at: '2026-01-01T00:00:00.000Z' })
      .execute();
    const streamed: LedgerProblem[] = [];
    try {
      const result = await verifyLedger(storage, { onProblem: (p) => streamed.push(p) });
      expect(result.problems.map((p) => [p.kind, p.id])).toEqual([
        ['unbalanced_transaction', tx],
        ['wallet_mismatch', wallet],
      ]);
      expect(result.problems[0]!.detail).toBe('legs sum to -3');
      expect(streamed).toEqual(result.problems);
      expect(result.problemCount).toBe(2);
    } finally {
      await storage.db.updateTable('wallets').set({ balance: sql`balance - 1` }).where('id', '=', wallet).execute();
    }
  }, 120_000);

  it('keeps the first 1,000 problems in memory, streams and counts them all', async () => {
    // The unbalanced posting added above stays (postings are append-only): counted on top of.
    const before = (await verifyLedger(storage)).problemCount;
    const seeded = storage.db.updateTable('wallets').where('id', 'like', 'wal_scale_%');
    await seeded.set({ balance: sql`balance + 1` }).execute();
    let streamed = 0;
    try {
      const result = await verifyLedger(storage, { onProblem: () => (streamed += 1) });
      expect(result.problems).toHaveLength(1_000);
      expect(result.problems.filter((p) => p.kind === 'wallet_mismatch')).toHaveLength(1_000 - before);
      expect(result.problemCount).toBe(before + WALLETS);
      expect(streamed).toBe(before + WALLETS);
    } finally {
      await seeded.set({ balance: sql`balance - 1` }).execute();
    }
  }, 120_000);
});

/**
 * Transaction i moves BASE_AMOUNT + i from the operator into wallet i mod WALLETS, written by SQL
 * (through the application it would take minutes); each wallet's stored balance is its postings' sum.
 */
async function seed(storage: Storage, dialect: 'sqlite' | 'postgres', merchantId: string) {
  const pad = (e: ReturnType<typeof sql>) => (dialect === 'postgres' ? sql`lpad((${e})::text, 7, '0')` : sql`printf('%07d', ${e})`);
  const numbers = (n: number) => sql`with recursive n(i) as (select 0 union all select i + 1 from n where i < ${sql.lit(n - 1)})`;
  const walletOf = pad(sql`i % ${sql.lit(WALLETS)}`);
  const at = '2026-01-01T00:00:00.000Z';
  await sql`${numbers(WALLETS)}
    insert into wallets (id, merchant_id, owner_type, balance, created_at)
    select 'wal_scale_' || ${pad(sql`i`)}, ${merchantId}, 'connection', 0, ${at} from n`.execute(storage.db);
  await sql`${numbers(TRANSACTIONS)}
    insert into ledger_transactions (id, kind, merchant_id, created_at)
    select 'ltx_scale_' || ${pad(sql`i`)}, 'test', ${merchantId}, ${at} from n`.execute(storage.db);
  await sql`${numbers(TRANSACTIONS)}
    insert into ledger_postings (id, transaction_id, account, amount, created_at)
    select 'pst_scale_w' || ${pad(sql`i`)}, 'ltx_scale_' || ${pad(sql`i`)}, 'wallet:wal_scale_' || ${walletOf} || ':prepaid', ${sql.lit(BASE_AMOUNT)} + i, ${at} from n
    union all
    select 'pst_scale_o' || ${pad(sql`i`)}, 'ltx_scale_' || ${pad(sql`i`)}, 'operator:funding', -(${sql.lit(BASE_AMOUNT)} + i), ${at} from n`.execute(storage.db);
  await sql`update wallets set balance = (select sum(amount) from ledger_postings p where p.account = 'wallet:' || wallets.id || ':prepaid')
    where id like 'wal_scale_%'`.execute(storage.db);
}
