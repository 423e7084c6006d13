import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { findWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Customer = { customer_id: string; wallet: { wallet_id: string; balance: string } };
type ErrorBody = { error: { code: string; status: number; message: string; issues?: { path: string[]; message: string }[] } };

describe.each(databasesUnderTest())('POST /v1/customers/:id/credits on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  async function newCustomer(headers = t.auth()): Promise<Customer> {
    const res = await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: { name: 'Grace' } });
    expect(res.statusCode).toBe(201);
    return res.json<Customer>();
  }
  const credit = (id: string, payload: unknown, headers: Record<string, string> = t.auth()) =>
    t.app.inject({ method: 'POST', url: `/v1/customers/${id}/credits`, headers, payload: payload as object });
  const getCustomer = async (id: string) =>
    (await t.app.inject({ method: 'GET', url: `/v1/customers/${id}`, headers: t.auth() })).json<Customer>();
  const balanceEvents = (customerId: string) =>
    t.storage.db
      .selectFrom('events')
      .select(['type', 'payload', 'merchant_id'])
      .where('type', '=', 'customer.wallet.balance.updated')
      .where('payload', 'like', `%"customer_id":"${customerId}"%`)
      .orderBy('id')
      .execute();

  it('grants credit: 201 with the new balance, shown on the customer object', async () => {
    const c = await newCustomer();
    const first = await credit(c.customer_id, { amount: '12.5', description: 'Welcome credit' });
    expect(first.statusCode, first.body).toBe(201);
    expect(first.json()).toEqual({
      credit_id: expect.any(String),
      customer_id: c.customer_id,
      wallet_id: c.wallet.wallet_id,
      amount: '12.5000000000',
      description: 'Welcome credit',
      balance: '12.5000000000',
      created_at: expect.any(String),
    });

    // The smallest unit adds exactly: 12.5 + 0.0000000001
    const second = await credit(c.customer_id, { amount: '0.0000000001' });
    expect(second.statusCode).toBe(201);
    expect(second.json()).toMatchObject({ amount: '0.0000000001', description: null, balance: '12.5000000001' });
    expect(second.json().credit_id).not.toBe(first.json().credit_id);

    expect((await getCustomer(c.customer_id)).wallet.balance).toBe('12.5000000001');
    expect((await findWallet(t.storage, c.wallet.wallet_id))?.balance).toBe(parseMoney('12.5000000001'));

    // Each grant is one balanced ledger transaction: wallet prepaid +, merchant credit grants −.
    const legs = await t.storage.db
      .selectFrom('ledger_postings')
      .select(['account', 'amount'])
      .where('transaction_id', '=', first.json().credit_id)
      .orderBy('account')
      .execute();
    expect(legs.map((l) => [l.account, BigInt(l.amount)])).toEqual([
      [`credit_grants:${t.merchant.merchantId}`, -parseMoney('12.5')],
      [`wallet:${c.wallet.wallet_id}:prepaid`, parseMoney('12.5')],
    ]);
  });

  it.each([
    ['zero', '0'],
    ['zero with decimals', '0.0000000000'],
    ['negative', '-1'],
    ['over-precise', '0.00000000001'],
    ['not a number', 'ten'],
    ['a JSON number', 5],
    ['null', null],
    ['above the largest amount', '100000000.0000000001'],
  ])('refuses an amount that is %s with 400 validation_error on ["amount"], granting nothing', async (_, amount) => {
    const c = await newCustomer();
    const res = await credit(c.customer_id, { amount, description: 'x' });
    expect(res.statusCode, res.body).toBe(400);
    const body = res.json<ErrorBody>();
    expect(body.error).toMatchObject({ code: 'validation_error', status: 400 });
    expect(body.error.issues?.map((i) => i.path)).toEqual([['amount']]);
    expect((await getCustomer(c.customer_id)).wallet.balance).toBe('0.0000000000');
    expect(await balanceEvents(c.customer_id)).toEqual([]);
  });

  it('refuses a missing amount with 400 on ["amount"]', async () => {
    const c = await newCustomer();
    const res = await credit(c.customer_id, { description: 'no amount' });
    expect(res.statusCode).toBe(400);
    expect(res.json<ErrorBody>().error.issues?.map((i) => i.path)).toEqual([['amount']]);
  });

  it('answers 404 for an unknown customer, another merchant’s customer, and a deleted one', async () => {
    const unknown = await credit('con_doesnotexist', { amount: '1' });
    expect(unknown.statusCode).toBe(404);
    expect(unknown.json<ErrorBody>().error.code).toBe('not_found');

    const other = await t.newMerchant('Other');
    const foreign = await newCustomer(t.auth(other.secretKey));
    const res = await credit(foreign.customer_id, { amount: '1' });
    expect(res.statusCode).toBe(404);
    expect(res.json<ErrorBody>().error.code).toBe('not_found');
    expect((await findWallet(t.storage, foreign.wallet.wallet_id))?.balance).toBe(0n);

    const gone = await newCustomer();
    expect((await t.app.inject({ method: 'DELETE', url: `/v1/customers/${gone.customer_id}`, headers: t.auth() })).statusCode).toBe(200);
    expect((await credit(gone.customer_id, { amount: '1' })).statusCode).toBe(404);
    expect((await findWallet(t.storage, gone.wallet.wallet_id))?.balance).toBe(0n);
  });

  it('writes a customer.wallet.balance.updated event for every grant and every charge', async () => {
    const c = await newCustomer();
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: t.auth(),
        payload: { name: 'Calls', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: '0', rate: '0.4' }] },
      })
    ).json<{ meter_slug: string }>();

    expect((await credit(c.customer_id, { amount: '1' })).statusCode).toBe(201);
    expect((await credit(c.customer_id, { amount: '0.5' })).statusCode).toBe(201);
    const charge = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(),
      payload: { request_id: `evt-${c.customer_id}`, customer_id: c.customer_id, meter_slug: meter.meter_slug },
    });
    expect(charge.statusCode).toBe(201);
    // A refused charge (402: 1.1 left cannot pay 5) changes nothing, so it writes no event.
    const refusedMeter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: t.auth(),
        payload: { name: 'Dear', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: '0', rate: '5' }] },
      })
    ).json<{ meter_slug: string }>();
    const refused = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(),
      payload: { request_id: `evt-refused-${c.customer_id}`, customer_id: c.customer_id, meter_slug: refusedMeter.meter_slug },
    });
    expect(refused.statusCode).toBe(402);

    const events = await balanceEvents(c.customer_id);
    // grant 1 → 1 ; grant 0.5 → 1.5 ; charge 0.4 → 1.1
    expect(events.map((e) => JSON.parse(e.payload) as Record<string, string>)).toEqual([
      expect.objectContaining({ customer_id: c.customer_id, connection_id: c.customer_id, wallet_id: c.wallet.wallet_id, balance: '1.0000000000' }),
      expect.objectContaining({ customer_id: c.customer_id, balance: '1.5000000000' }),
      expect.objectContaining({ customer_id: c.customer_id, balance: '1.1000000000' }),
    ]);
    for (const e of events) expect(e.merchant_id).toBe(t.merchant.merchantId);
  });

  it('replays a credit sent again with the same Idempotency-Key without granting twice', async () => {
    const c = await newCustomer();
    const headers = { ...t.auth(), 'idempotency-key': `credit-${c.customer_id}` };
    const first = await credit(c.customer_id, { amount: '7.25', description: 'Refund' }, headers);
    expect(first.statusCode).toBe(201);
    const again = await credit(c.customer_id, { amount: '7.25', description: 'Refund' }, headers);
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json()).toEqual(first.json());

    // Same key, different amount: refused, nothing granted.
    const reused = await credit(c.customer_id, { amount: '8', description: 'Refund' }, headers);
    expect(reused.statusCode).toBe(422);
    expect(reused.json<ErrorBody>().error.code).toBe('idempotency_key_reused');

    expect((await getCustomer(c.customer_id)).wallet.balance).toBe('7.2500000000');
    expect(await balanceEvents(c.customer_id)).toHaveLength(1);
    const grants = await t.storage.db
      .selectFrom('ledger_postings')
      .select('transaction_id')
      .where('account', '=', `wallet:${c.wallet.wallet_id}:prepaid`)
      .execute();
    expect(grants).toHaveLength(1);

    // Without a key, the same body is a new grant.
    expect((await credit(c.customer_id, { amount: '7.25', description: 'Refund' })).statusCode).toBe(201);
    expect((await getCustomer(c.customer_id)).wallet.balance).toBe('14.5000000000');
  });
});
