import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { forwardToken, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { openaiHoldOf, startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { admissionOf } from '../helpers/settle.ts';

/**
 * Requests recovered from their hold estimates (their settlement never came, decision 0019) are
 * charged as their settlements would have been: a recovered request takes its place in its meter's
 * tiers (the customer's next request is priced at the tier after it), and a sweep that recovers
 * several requests of one wallet writes that wallet once, with one balance event (decision 0020).
 */
const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;
const body = { model: 'gpt-4o', max_tokens: 20, messages: [{ role: 'user', content: 'priced by the request' }] };
// The first request of the month costs 0.1, every later one 0.01.
const TIERED = { name: 'Tiered', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.1' }, { start: 1, rate: '0.01' }] };

describe.each(databasesUnderTest())('recovered requests, on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed-openai' } }));
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  /** A customer of a tiered meter, and a request of theirs admitted, whose instance then died. */
  async function customerWithOrphan() {
    const customer = await t.customerWithMeter({ credit: '5', meter: TIERED });
    const token = forwardToken(t.merchant.secretKey, customer.customerId, customer.meterSlug);
    const billing = await resolveForwardCredential(t.storage, token, new Date(t.clock.now()));
    const estimate = await openaiHoldOf(t, token, body);
    const admitOrphan = async () => {
      // Admitted, then its instance died: nothing renews its hold, and the sweep finds it past its TTL.
      const admitted = await admitRequest(t.storage, { ...admissionOf(billing, customer.walletId, { hold: '0', ttlMs: 60_000 }), estimate });
      expect(admitted.outcome).toBe('admitted');
      return (admitted as { recordId: string }).recordId;
    };
    return { customer, token, recordId: await admitOrphan(), admitOrphan };
  }

  it("charges the recovered request the first tier's price and the customer's next request the second tier's", async () => {
    const { customer, token, recordId } = await customerWithOrphan();
    expect(await sweepExpiredHolds(t.storage, new Date(t.clock.now() + 120_000))).toBe(1);

    const recovered = await t.storage.db.selectFrom('requests').selectAll().where('id', '=', recordId).executeTakeFirstOrThrow();
    expect({ status: recovered.status, estimated: Number(recovered.usage_estimated), fee: BigInt(recovered.fee_amount) }).toEqual({
      status: 'completed',
      estimated: 1,
      fee: parseMoney('0.1'),
    });
    const counters = await t.storage.db.selectFrom('meter_usage_counters').select('units').where('meter_id', '=', customer.meterId).execute();
    expect(counters.map((c) => BigInt(c.units))).toEqual([1n]);

    const res = await fetch(`${base}/v1/forward?${OPENAI_CHAT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    const next = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    expect(next.status).toBe('completed');
    expect(parseMoney(next.fee.amount as string)).toBe(parseMoney('0.01'));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('writes each wallet once, with one balance event, however many of its requests one sweep recovers', async () => {
    const { customer, admitOrphan } = await customerWithOrphan();
    await admitOrphan();
    await admitOrphan();
    const balanceEvents = () =>
      t.storage.db
        .selectFrom('events')
        .select('payload')
        .where('type', '=', 'customer.wallet.balance.updated')
        .where('payload', 'like', `%${customer.walletId}%`)
        .execute();
    const before = (await balanceEvents()).length;
    expect(await sweepExpiredHolds(t.storage, new Date(t.clock.now() + 120_000))).toBe(3);

    const events = await balanceEvents();
    expect(events.length - before).toBe(1);
    const wallet = await t.storage.db.selectFrom('wallets').selectAll().where('id', '=', customer.walletId).executeTakeFirstOrThrow();
    const charged = await t.storage.db.selectFrom('requests').select('total_wallet_cost').where('connection_id', '=', customer.customerId).where('status', '=', 'completed').execute();
    expect(charged).toHaveLength(3);
    const total = charged.reduce((sum, r) => sum + BigInt(r.total_wallet_cost), 0n);
    expect(BigInt(wallet.balance)).toBe(parseMoney('5') - total);
    expect(JSON.parse(events.at(-1)!.payload)).toMatchObject({ wallet_id: customer.walletId, balance: formatMoney(BigInt(wallet.balance)), held: '0.0000000000' });
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
