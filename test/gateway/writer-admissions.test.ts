import { describe, expect, it, vi } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { GroupCommitWriter } from '../../src/ledger/group-commit.ts';
import { ADMIT_JOB } from '../../src/ledger/admission/admit.ts';
import { ADMISSION_WRITE_DELAY_MS, admitDeferred, deferredWrites, releaseDeferredHolds, takeOverAdmission } from '../../src/ledger/admission/deferred.ts';
import { SETTLE_JOB } from '../../src/ledger/settlement/settle.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { openStorage } from '../../src/storage/db.ts';
import { forwardToken, useTestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { admissionOf, CHAT_FACTS, settlementOf, tokenUsage } from '../helpers/settle.ts';

/**
 * The gateway's group-commit writer admitting requests: a batch never holds more than the wallet
 * has (PostgreSQL's one-statement admission writes all or nothing), and the embedded (SQLite)
 * admission counts holds not written yet, is taken over by its settlement, and decides on fresh
 * reads of the wallet when it must.
 */

describe.each(databasesUnderTest())('gateway writer on %s', (dialect) => {
  const t = useTestApp(dialect);

  it.runIf(dialect === 'postgres')('the one-statement admission writes everything, or nothing when a wallet cannot cover the batch', async () => {
    const merchant = await t.newMerchant('One statement');
    await creditWallet(t.storage, merchant.walletId, parseMoney('0.05'), new Date().toISOString());
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const input = () => admissionOf(billing, merchant.walletId, { hold: '0.02', facts: { ...CHAT_FACTS, metadata: { k: 'v' } } });
    const fast = ADMIT_JOB.wholeBatch!;
    const two = await fast(t.storage, [input(), input()]);
    expect(two?.map((o) => o.outcome)).toEqual(['admitted', 'admitted']);
    const holds = await t.storage.db.selectFrom('holds').select(['amount', 'status']).where('wallet_id', '=', merchant.walletId).execute();
    expect(holds.length).toBe(2);
    expect((await findWallet(t.storage, merchant.walletId))!.held).toBe(parseMoney('0.04'));
    const metadata = await t.storage.db.selectFrom('request_metadata').select('key').where('merchant_id', '=', merchant.merchantId).execute();
    expect(metadata.length).toBe(2);

    // 0.01 left: a batch needing 0.04 writes nothing, and leaves the batch to the member-by-member path.
    expect(await fast(t.storage, [input(), input()])).toBeNull();
    expect((await findWallet(t.storage, merchant.walletId))!.held).toBe(parseMoney('0.04'));
    const records = await t.storage.db.selectFrom('requests').select('id').where('merchant_id', '=', merchant.merchantId).execute();
    expect(records.length).toBe(2);
  });

  it('admissions in one batch never hold more than the wallet has', async () => {
    const merchant = await t.newMerchant('Tight');
    await creditWallet(t.storage, merchant.walletId, parseMoney('0.05'), new Date().toISOString());
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const writer = new GroupCommitWriter(t.storage);
    const outcomes = await Promise.all(
      Array.from({ length: 12 }, () =>
        writer.run(ADMIT_JOB, admissionOf(billing, merchant.walletId, { hold: '0.01', facts: { ...CHAT_FACTS, metadata: { k: 'v' } } })),
      ),
    );
    expect(outcomes.filter((o) => o.outcome === 'admitted').length).toBe(5);
    expect(outcomes.filter((o) => o.outcome === 'insufficient_balance').length).toBe(7);
    const wallet = (await findWallet(t.storage, merchant.walletId))!;
    expect(wallet.held).toBe(parseMoney('0.05'));
    const pending = await t.storage.db.selectFrom('requests').select('id').where('merchant_id', '=', merchant.merchantId).execute();
    expect(pending.length).toBe(5);
    await writer.drain();
  });

  /** A credited customer with a per-request meter, its forward billing and what an admission of it sends. */
  async function embeddedCustomer(credit: string, metadata: Record<string, string>, writeDelayMs = ADMISSION_WRITE_DELAY_MS) {
    const customer = await t.customerWithMeter({ credit });
    const token = forwardToken(t.merchant.secretKey, customer.customerId, customer.meterSlug);
    const billing = await resolveForwardCredential(t.storage, token, new Date());
    const record = { ...CHAT_FACTS, metadata };
    const admission = (hold: string) => admissionOf(billing, customer.walletId, { hold, facts: record });
    const background = new GroupCommitWriter(t.storage);
    return { customer, billing, background, writes: deferredWrites(background, undefined, writeDelayMs), record, admission };
  }

  it.runIf(dialect === 'sqlite')(
    'embedded admission: a hold not written yet still counts against the wallet, and its rows land before its settlement',
    async () => {
      const { customer, billing, background, record, admission, writes } = await embeddedCustomer('0.01', { k: 'v' });

      const first = await admitDeferred(t.storage, writes, admission('0.01'));
      if (first.outcome !== 'admitted') throw new Error(first.outcome);
      // Its hold is only in memory until the background writer commits it: it counts all the same,
      // for the next admission and for a POST /requests charge of the same customer.
      const second = admitDeferred(t.storage, writes, admission('0.001'));
      const charge = t.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers: t.auth(),
        payload: { request_id: 'during-flight', customer_id: customer.customerId, meter_slug: customer.meterSlug },
      });
      expect((await second).outcome).toBe('insufficient_balance');
      expect((await charge).statusCode).toBe(402);

      await first.deferred!.written;
      const wallet = (await findWallet(t.storage, customer.walletId))!;
      expect(wallet.held).toBe(parseMoney('0.01'));
      const hold = await t.storage.db.selectFrom('holds').select(['amount', 'status']).where('reference', '=', first.recordId).executeTakeFirstOrThrow();
      expect(hold).toEqual({ amount: parseMoney('0.01'), status: 'active' });
      const pending = await t.storage.db.selectFrom('requests').select(['status', 'created_at']).where('id', '=', first.recordId).executeTakeFirstOrThrow();
      expect(pending).toEqual({ status: 'pending', created_at: first.createdAt });
      // Written and in memory are never both counted once the write is done.
      expect((await admitDeferred(t.storage, writes, admission('0.001'))).outcome).toBe('insufficient_balance');

      const settled = await background.run(SETTLE_JOB, settlementOf(first, { billing, usage: tokenUsage(10, 5), record }));
      expect(settled.outcome).toBe('recorded');
      const after = (await findWallet(t.storage, customer.walletId))!;
      expect(after.held).toBe(0n);
      expect(after.balance).toBe(parseMoney('0.01') - (settled.outcome === 'recorded' ? settled.priced.totals.wallet : 0n));
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
      await background.drain();
    },
  );

  it.runIf(dialect === 'sqlite')(
    'embedded admission taken over by its settlement: one completed record, no hold rows, the reservation ends with the charge',
    async () => {
      const { customer, billing, background, record, admission, writes } = await embeddedCustomer('0.02', { team: 'a' });

      const admitted = await admitDeferred(t.storage, writes, admission('0.02'));
      if (admitted.outcome !== 'admitted') throw new Error(admitted.outcome);
      expect(takeOverAdmission(admitted.deferred)).toBe(true);
      // Taken over once: a second settlement (or the write itself) finds it no longer queued.
      expect(takeOverAdmission(admitted.deferred)).toBe(false);
      const settled = await background.run(SETTLE_JOB, { ...settlementOf(admitted, { billing, usage: tokenUsage(10, 5), record }), merged: admitted.deferred });
      await admitted.deferred!.written;
      if (settled.outcome !== 'recorded') throw new Error(settled.outcome);
      // The per-request meter charges 0.25: more than the 0.02 held, as a provider overshooting its hold would.
      expect(settled.priced.totals.wallet).toBe(parseMoney('0.25'));

      const stored = await t.storage.db.selectFrom('requests').select(['status', 'created_at', 'total_wallet_cost']).where('id', '=', admitted.recordId).execute();
      expect(stored).toEqual([{ status: 'completed', created_at: admitted.createdAt, total_wallet_cost: parseMoney('0.25') }]);
      const metadata = await t.storage.db.selectFrom('request_metadata').select(['key', 'value']).where('request_pk', '=', admitted.recordId).execute();
      expect(metadata).toEqual([{ key: 'team', value: 'a' }]);
      expect(await t.storage.db.selectFrom('holds').select('id').where('reference', '=', admitted.recordId).execute()).toEqual([]);
      const wallet = (await findWallet(t.storage, customer.walletId))!;
      expect(wallet).toMatchObject({ held: 0n, balance: parseMoney('0.02') - parseMoney('0.25') });

      // Until the settlement's caller ends the reservation it still counts; then only the balance does.
      releaseDeferredHolds(admitted.deferred!);
      await creditWallet(t.storage, customer.walletId, parseMoney('0.24'), new Date().toISOString());
      expect((await admitDeferred(t.storage, writes, admission('0.01'))).outcome).toBe('admitted');
      await background.drain();
    },
  );

  it.runIf(dialect === 'sqlite')(
    'embedded admission decides on the wallet it last read while nothing was written, reads it again after a write of this process',
    async () => {
      // Long enough that neither admission is written before the test takes both over, however slow the machine.
      const { customer, billing, background, record, admission, writes } = await embeddedCustomer('0.05', {}, 60_000);
      const reads = vi.spyOn(t.storage.db, 'connection');
      try {
        const first = await admitDeferred(t.storage, writes, admission('0.02'));
        if (first.outcome !== 'admitted') throw new Error(first.outcome);
        expect(reads).toHaveBeenCalledTimes(1);
        const second = await admitDeferred(t.storage, writes, admission('0.02'));
        if (second.outcome !== 'admitted') throw new Error(second.outcome);
        expect(reads).toHaveBeenCalledTimes(1);

        // Both settle at 0.25 each (the per-request meter): the wallet is at -0.45 once they are written.
        for (const admitted of [first, second]) {
          expect(takeOverAdmission(admitted.deferred)).toBe(true);
          await background.run(SETTLE_JOB, { ...settlementOf(admitted, { billing, usage: tokenUsage(10, 5), record }), merged: admitted.deferred });
          releaseDeferredHolds(admitted.deferred!);
        }
        // The row read before those writes said 0.05 with nothing held: it is not used again.
        expect((await admitDeferred(t.storage, writes, admission('0.001'))).outcome).toBe('insufficient_balance');
        expect(reads).toHaveBeenCalledTimes(2);
      } finally {
        reads.mockRestore();
      }
      expect((await findWallet(t.storage, customer.walletId))!.balance).toBe(parseMoney('-0.45'));
      await background.drain();
    },
  );

  it.runIf(dialect === 'sqlite')(
    'embedded admission takes a refusal against a fresh read: a credit another process made (the CLI) is seen',
    async () => {
      const { customer, background, admission, writes } = await embeddedCustomer('0.05', {});
      expect((await admitDeferred(t.storage, writes, admission('0.01'))).outcome).toBe('admitted');
      // This process does not see another's writes: its last read of the wallet says 0.04 is left.
      const cli = openStorage(t.database.url);
      try {
        await creditWallet(cli, customer.walletId, parseMoney('1'), new Date().toISOString());
      } finally {
        await cli.close();
      }
      expect((await admitDeferred(t.storage, writes, admission('0.5'))).outcome).toBe('admitted');
      await background.drain();
    },
  );
});
