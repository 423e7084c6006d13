import type { FastifyBaseLogger } from 'fastify';
import { sql, type Transaction } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { GroupCommitWriter } from '../../src/ledger/group-commit.ts';
import { ADMIT_JOB, type AdmitOutcome } from '../../src/ledger/admission/admit.ts';
import { SETTLE_JOB } from '../../src/ledger/settlement/settle.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import type { Database } from '../../src/storage/schema.ts';
import { forwardToken, startTestApp, type TestApp } from '../helpers/app.ts';
import { admissionOf, CHAT_FACTS, settlementOf, tokenUsage } from '../helpers/settle.ts';
import { until } from '../helpers/until.ts';

/**
 * Every writer locks rows in one global order (tier counters, wallets, then what belongs to them,
 * then spend keys), so no two transactions can deadlock. These tests hold a row in another
 * transaction that keeps that order, as a POST /requests charge or another instance would, and
 * prove the gateway's batched writes wait for it instead of deadlocking with it. The other
 * transaction detects deadlocks after 100 ms (PostgreSQL's default is 1 s), so a batch taking rows
 * out of order fails it at once.
 */

describe.skipIf(!process.env.TEST_DATABASE_URL)('lock order of the gateway writer on postgres', () => {
  let t: TestApp;
  let other: Storage;

  beforeAll(async () => {
    t = await startTestApp('postgres');
    other = openStorage(t.database.url, { poolSize: 1 });
  });
  afterAll(async () => {
    await other?.close();
    await t?.close();
  });

  type Step = (trx: Transaction<Database>) => Promise<unknown>;

  /**
   * Runs `first` in a transaction of its own, then waits until one of the writer's statements
   * waits on it, runs `then` and commits. Resolves with the error `then` met, if any.
   */
  async function holdWhileWriterWaits(first: Step, then: Step, startWriter: () => void): Promise<unknown> {
    let failure: unknown;
    await other.db.transaction().execute(async (trx) => {
      await sql`set local deadlock_timeout = '100ms'`.execute(trx);
      const { pid } = (await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(trx)).rows[0]!;
      await first(trx);
      startWriter();
      await blockedBy(pid);
      failure = await then(trx).then(
        () => undefined,
        (e: unknown) => e,
      );
      if (failure) throw failure;
    }).catch(() => undefined);
    return failure;
  }

  async function blockedBy(pid: number): Promise<void> {
    await until(async () => {
      const { n } = (await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where ${pid} = any(pg_blocking_pids(pid))`.execute(t.storage.db)).rows[0]!;
      return n > 0;
    }, 'the writer to wait on the other transaction');
  }

  const lockWallet = (id: string): Step => (trx) => trx.selectFrom('wallets').select('id').where('id', '=', id).forUpdate().execute();

  /** A writer whose warnings (a batch that failed as a whole) the test can read. */
  function watchedWriter(): { writer: GroupCommitWriter; warnings: string[] } {
    const warnings: string[] = [];
    const log: Pick<FastifyBaseLogger, 'warn'> = { warn: (...args: unknown[]) => void warnings.push(String(args.at(-1))) };
    return { writer: new GroupCommitWriter(t.storage, log), warnings };
  }

  function admitted(outcome: AdmitOutcome) {
    if (outcome.outcome !== 'admitted') throw new Error(outcome.outcome);
    return outcome;
  }

  it('a settlement locks its wallets before it writes rollups, as a charge does, so the two do not deadlock', async () => {
    const merchant = await t.newMerchant('Rollups');
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'), new Date().toISOString());
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const { writer, warnings } = watchedWriter();
    const admit = async () => admitted(await writer.run(ADMIT_JOB, admissionOf(billing, merchant.walletId, { hold: '0.01' })));
    const settle = (a: Awaited<ReturnType<typeof admit>>) => writer.run(SETTLE_JOB, settlementOf(a, { billing, usage: tokenUsage(10, 5), record: CHAT_FACTS }));
    // The merchant's rollup row exists, so writing it takes that row's lock.
    expect((await settle(await admit())).outcome).toBe('recorded');
    const second = await admit();

    let settled: Promise<unknown> | undefined;
    const failure = await holdWhileWriterWaits(
      lockWallet(merchant.walletId),
      // What a charge of the same merchant writes after its wallet: the rollup.
      (trx) => trx.updateTable('usage_rollups').set((eb) => ({ requests: eb.ref('requests') })).where('merchant_id', '=', merchant.merchantId).execute(),
      () => (settled = settle(second)),
    );
    expect(failure).toBeUndefined();
    expect(await settled).toMatchObject({ outcome: 'recorded' });
    expect(warnings).toEqual([]);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a batch of a settlement and an admission locks every wallet of both first, in order', async () => {
    const customers = await Promise.all([t.customerWithMeter({ credit: '5' }), t.customerWithMeter({ credit: '5' })]);
    // The admission's wallet sorts first, so taking the settlement's wallets first would be out of order.
    const [admitting, settling] = customers.sort((a, b) => (a.walletId < b.walletId ? -1 : 1)) as [(typeof customers)[0], (typeof customers)[0]];
    const billingOf = async (c: (typeof customers)[0]) =>
      resolveForwardCredential(t.storage, forwardToken(t.merchant.secretKey, c.customerId, c.meterSlug), new Date());
    const [admitBilling, settleBilling] = [await billingOf(admitting), await billingOf(settling)];
    const { writer, warnings } = watchedWriter();
    const toSettle = admitted(await writer.run(ADMIT_JOB, admissionOf(settleBilling, settling.walletId, { hold: '0.01' })));

    let batch: Promise<unknown[]> | undefined;
    const failure = await holdWhileWriterWaits(
      lockWallet(admitting.walletId),
      // In order: the lower wallet first, then the higher.
      lockWallet(settling.walletId),
      () =>
        (batch = Promise.all([
          writer.run(SETTLE_JOB, settlementOf(toSettle, { billing: settleBilling, usage: tokenUsage(10, 5), record: CHAT_FACTS })),
          writer.run(ADMIT_JOB, admissionOf(admitBilling, admitting.walletId, { hold: '0.01' })),
        ])),
    );
    expect(failure).toBeUndefined();
    const [settled, admission] = (await batch!) as [{ outcome: string }, AdmitOutcome];
    expect(settled.outcome).toBe('recorded');
    expect(admission.outcome).toBe('admitted');
    expect(warnings).toEqual([]);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    await writer.drain();
  });
});
