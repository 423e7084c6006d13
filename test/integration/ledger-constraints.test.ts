import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/ids.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { operatorFundingAccount, walletAccount } from '../../src/ledger/accounts.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * The database itself refuses rows that break the ledger's invariants (migration
 * 0005_ledger_constraints), whatever code writes them.
 */
describe.each(databasesUnderTest())('ledger constraints on %s', (dialect) => {
  let t: TestApp;
  let walletId: string;
  let transactionId: string;
  let recordId: string;

  beforeAll(async () => {
    t = await startTestApp(dialect);
    walletId = t.merchant.walletId;
    await creditWallet(t.storage, walletId, parseMoney('5'), new Date().toISOString());
    transactionId = (await t.storage.db.selectFrom('ledger_transactions').select('id').executeTakeFirstOrThrow()).id;
    const h = t.auth();
    const { customerId, meterSlug } = await t.customerWithMeter({
      credit: '1',
      meter: { name: 'Calls', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: '0', rate: '0.1' }] },
    });
    const recorded = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: h,
      payload: { request_id: 'constrained', customer_id: customerId, meter_slug: meterSlug },
    });
    expect(recorded.statusCode).toBe(201);
    recordId = (await t.storage.db.selectFrom('requests').select('id').where('request_id', '=', 'constrained').executeTakeFirstOrThrow()).id;
  });
  afterAll(async () => t?.close());

  const postingsOf = (id: string) =>
    t.storage.db.selectFrom('ledger_postings').select(['account', 'amount']).where('transaction_id', '=', id).orderBy('account').execute();

  describe('postings and ledger transactions are append-only', () => {
    it('refuses to update or delete a posting', async () => {
      const before = await postingsOf(transactionId);
      await expect(t.storage.db.updateTable('ledger_postings').set({ amount: 1n }).where('transaction_id', '=', transactionId).execute()).rejects.toThrow(
        /append-only/,
      );
      await expect(t.storage.db.deleteFrom('ledger_postings').where('transaction_id', '=', transactionId).execute()).rejects.toThrow(/append-only/);
      expect(await postingsOf(transactionId)).toEqual(before);
    });

    it('refuses to update or delete a ledger transaction', async () => {
      await expect(
        t.storage.db.updateTable('ledger_transactions').set({ description: 'rewritten' }).where('id', '=', transactionId).execute(),
      ).rejects.toThrow(/append-only/);
      await expect(t.storage.db.deleteFrom('ledger_transactions').where('id', '=', transactionId).execute()).rejects.toThrow(/append-only/);
      const row = await t.storage.db.selectFrom('ledger_transactions').select('description').where('id', '=', transactionId).executeTakeFirstOrThrow();
      expect(row.description).toBe('Operator credit');
    });

    it.runIf(dialect === 'postgres')('refuses to truncate either table', async () => {
      await expect(sql`truncate ledger_postings`.execute(t.storage.db)).rejects.toThrow(/append-only/);
      await expect(sql`truncate ledger_transactions cascade`.execute(t.storage.db)).rejects.toThrow(/append-only/);
    });
  });

  /** Writes one ledger transaction with the given legs directly, bypassing appendTransaction's own check. */
  const writeDirectly = (amounts: bigint[]) =>
    t.storage.db.transaction().execute(async (trx) => {
      const id = newId('transaction');
      const at = new Date().toISOString();
      await trx.insertInto('ledger_transactions').values({ id, kind: 'test', merchant_id: t.merchant.merchantId, reference: null, description: null, created_at: at }).execute();
      const accounts = [walletAccount(walletId, 'prepaid'), operatorFundingAccount(), walletAccount(walletId, 'cycle')];
      await trx
        .insertInto('ledger_postings')
        .values(amounts.map((amount, i) => ({ id: newId('posting'), transaction_id: id, account: accounts[i]!, amount, created_at: at })))
        .execute();
      return id;
    });

  it.runIf(dialect === 'postgres')('refuses a statement that leaves a ledger transaction whose postings do not sum to zero', async () => {
    await expect(writeDirectly([7n, -6n])).rejects.toThrow(/does not balance/);
    // Balanced, it commits (the legs may arrive in any order and any number).
    const id = await writeDirectly([7n, -10n, 3n]);
    expect((await postingsOf(id)).length).toBe(3);
    const unbalanced = await t.storage.db.selectFrom('ledger_transactions').select('id').where('kind', '=', 'test').execute();
    expect(unbalanced.map((r) => r.id)).toEqual([id]);
  });

  it.runIf(dialect === 'postgres')('refuses a posting appended later to a balanced ledger transaction', async () => {
    const id = await writeDirectly([5n, -5n]);
    const late = { id: newId('posting'), transaction_id: id, account: walletAccount(walletId, 'prepaid'), amount: 1n, created_at: new Date().toISOString() };
    await expect(t.storage.db.insertInto('ledger_postings').values(late).execute()).rejects.toThrow(/does not balance/);
    expect((await postingsOf(id)).map((p) => p.amount).sort()).toEqual([-5n, 5n]);
  });

  it('refuses a zero posting', async () => {
    await expect(writeDirectly([0n])).rejects.toThrow(/ledger_postings_amount_nonzero/);
  });

  it.each(['cycle_credit', 'bundle_credit'] as const)('refuses a negative %s', async (column) => {
    const before = await findWallet(t.storage, walletId);
    await expect(t.storage.db.updateTable('wallets').set({ [column]: -1n }).where('id', '=', walletId).execute()).rejects.toThrow(
      new RegExp(`wallets_${column}_nonnegative`),
    );
    expect(await findWallet(t.storage, walletId)).toEqual(before);
    await expect(
      t.storage.db
        .insertInto('wallets')
        .values({ ...before!, id: newId('wallet'), [column]: -1n })
        .execute(),
    ).rejects.toThrow(new RegExp(`wallets_${column}_nonnegative`));
  });

  it.each(['input_cost', 'output_cost', 'fee_amount', 'service_charge_amount', 'total_merchant_cost'] as const)(
    'refuses a request record with a negative %s',
    async (column) => {
      const stored = await t.storage.db.selectFrom('requests').selectAll().where('id', '=', recordId).executeTakeFirstOrThrow();
      // total_request_cost = wallet + merchant holds either way (its own CHECK), so only the sign is wrong.
      const negative = column === 'total_merchant_cost' ? { total_merchant_cost: -1n, total_wallet_cost: stored.total_request_cost + 1n } : { [column]: -1n };
      await expect(t.storage.db.updateTable('requests').set(negative).where('id', '=', recordId).execute()).rejects.toThrow(/requests_costs_nonnegative/);
      await expect(
        t.storage.db
          .insertInto('requests')
          .values({ ...stored, id: newId('request'), request_id: `negative-${column}`, ...negative })
          .execute(),
      ).rejects.toThrow(/requests_costs_nonnegative/);
      const after = await t.storage.db.selectFrom('requests').selectAll().where('id', '=', recordId).executeTakeFirstOrThrow();
      expect(after).toEqual(stored);
    },
  );

  it('refuses a provider_key_type nothing records', async () => {
    await expect(
      t.storage.db
        .updateTable('requests')
        .set({ provider_key_type: 'stored' as 'managed' })
        .where('id', '=', recordId)
        .execute(),
    ).rejects.toThrow(/requests_provider_key_type_known/);
  });
});
