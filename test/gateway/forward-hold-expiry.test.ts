import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { CHAT_BODY as body, useAdmissionGateway } from '../helpers/admission-gateway.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';

/**
 * Holds and their TTL over real HTTP: a request still relaying keeps its hold alive
 * past the TTL and is charged when it ends; a hold nobody renews is swept by sweepExpiredHolds,
 * which charges the record its hold estimate (never free) and leaves nothing for a late answer.
 */

describe.each(databasesUnderTest())('forward gateway admission and holds on %s', (dialect) => {
  const { t, upstream, record, wallet, post, freshPayers } = useAdmissionGateway(dialect);

  /**
   * A funded merchant's forwarded request that the provider answers only on `answer()` (the hold's
   * TTL is 1 s, HOLD_TTL_MS), with the pending record its admission wrote. The caller answers it
   * in a finally: closing the app would wait for a request left in flight.
   */
  async function heldAtProvider() {
    const { merchant } = await freshPayers();
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'), dateOf(t.clock).toISOString());
    const before = await wallet(merchant.walletId);
    let answer!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answer = resolve)) });
    const inFlight = post(merchant.secretKey, body).then(async (res) => ({ res, text: await res.text() }));
    let pending: { id: string; created_at: string };
    try {
      pending = await until(
        () =>
          t.storage.db
            .selectFrom('requests')
            .select(['id', 'created_at'])
            .where('merchant_id', '=', merchant.merchantId)
            .where('status', '=', 'pending')
            .executeTakeFirst(),
        'admission to write a pending record',
      );
    } catch (error) {
      answer();
      await inFlight.catch(() => undefined);
      throw error;
    }
    return { merchant, before, pending, answer, inFlight };
  }

  it('a request still relaying when its TTL passes keeps its hold alive and is charged when it ends', async () => {
    const { merchant, before, pending, answer, inFlight } = await heldAtProvider();
    try {
      // Well past the TTL the hold admission placed, the sweeper finds nothing: the hold keeper
      // (every third of a TTL) pushed it a full TTL past the clock's new time.
      t.clock.advance(1600);
      const renewedPast = Date.parse(pending.created_at) + 1600;
      const holdRow = () => t.storage.db.selectFrom('holds').selectAll().where('reference', '=', pending.id).executeTakeFirstOrThrow();
      const hold = await until(async () => {
        const row = await holdRow();
        return Date.parse(row.expires_at) > renewedPast && row;
      }, 'the hold keeper to renew the hold past the moved clock');
      expect(await sweepExpiredHolds(t.storage, dateOf(t.clock))).toBe(0);
      expect(hold.status).toBe('active');
      expect(Date.parse(hold.expires_at)).toBeGreaterThan(renewedPast);
      expect((await record(pending.id, merchant)).status).toBe('pending');
      answer();

      const { res } = await inFlight;
      expect(res.status).toBe(200);
      const rec = await t.settledRecord(pending.id, t.auth(merchant.secretKey));
      expect(rec.status).toBe('completed');
      expect(parseMoney(rec.total_request_cost)).toBeGreaterThan(0n);
      const after = await wallet(merchant.walletId);
      expect(after.balance).toBe(before.balance - parseMoney(rec.total_merchant_cost));
      expect(after.held).toBe(0n);
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    } finally {
      answer();
      await inFlight.catch(() => undefined);
    }
  });

  it('a hold left unrenewed past its TTL (its instance stalled or died) is swept: the record is charged its hold estimate, flagged estimated; a late answer charges nothing more', async () => {
    const { merchant, before, pending, answer, inFlight } = await heldAtProvider();
    try {
      const holds = await t.storage.db.selectFrom('holds').selectAll().where('reference', '=', pending.id).execute();
      expect(holds.length).toBe(1);
      expect(holds[0]!.status).toBe('active');
      expect((await wallet(merchant.walletId)).held).toBe(BigInt(holds[0]!.amount));

      // Not yet expired: nothing to sweep.
      expect(await sweepExpiredHolds(t.storage, dateOf(t.clock))).toBe(0);
      // As if the sweeper ran a whole TTL after the last renewal.
      expect(await sweepExpiredHolds(t.storage, new Date(t.clock.now() + 60_000))).toBe(1);
      expect((await t.storage.db.selectFrom('holds').select('status').where('id', '=', holds[0]!.id).executeTakeFirstOrThrow()).status).toBe(
        'expired',
      );
      // The provider may have answered: never free. It is charged what its hold was placed for.
      const recovered = await record(pending.id, merchant);
      expect(recovered.status).toBe('completed');
      expect(recovered.usage_estimated).toBe(true);
      const holdAmount = BigInt(holds[0]!.amount);
      expect(parseMoney(recovered.total_merchant_cost) + parseMoney(recovered.total_wallet_cost)).toBe(holdAmount);
      const swept = await wallet(merchant.walletId);
      expect(swept.held).toBe(0n);
      expect(swept.balance).toBe(before.balance - holdAmount);
      // A second sweep finds nothing.
      expect(await sweepExpiredHolds(t.storage, new Date(t.clock.now() + 60_000))).toBe(0);

      // The provider answers after all: the client gets its answer; the record keeps its one charge.
      answer();
      const { res } = await inFlight;
      expect(res.status).toBe(200);
      expect(res.headers.get('x-tollgate-request-id')).toBe(pending.id);
      await t.app.gateway.settlements.drain();
      const rec = await record(pending.id, merchant);
      expect(rec.status).toBe('completed');
      expect(rec.usage_estimated).toBe(true);
      const charges = await t.storage.db.selectFrom('ledger_transactions').select('id').where('reference', '=', pending.id).execute();
      expect(charges.length).toBe(1);
      const after = await wallet(merchant.walletId);
      expect(after.balance).toBe(before.balance - holdAmount);
      expect(after.held).toBe(0n);
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    } finally {
      // Never leave a forwarded request in flight behind a failed assertion (closing would wait for it).
      answer();
      await inFlight.catch(() => undefined);
    }
  });
});
