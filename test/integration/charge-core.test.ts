import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { ADMIT_JOB } from '../../src/ledger/admission/admit.ts';
import { CHARGE_JOB, chargeWriter, type BatchOutcome } from '../../src/ledger/charge-batch.ts';
import type { ChargeInput, ChargeOutcome } from '../../src/ledger/charge.ts';
import { GroupCommitWriter } from '../../src/ledger/group-commit.ts';
import { SETTLE_JOB } from '../../src/ledger/settlement/settle.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { findConnection } from '../../src/storage/connections.ts';
import { findMerchant } from '../../src/storage/merchants.ts';
import { findMeter } from '../../src/storage/meters.ts';
import type { RequestRow } from '../../src/storage/requests.ts';
import { forwardToken, startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { admissionOf, settlementOf, tokenUsage } from '../helpers/settle.ts';

/**
 * One charge core (decision 0020): a forwarded request's settlement and a POST /requests charge
 * are priced (priceCharge), posted on their wallets and split into ledger legs (postCharge) by the
 * same functions, and every path emits one balance event per wallet a database transaction
 * changed.
 */
describe.each(databasesUnderTest())('the charge core on %s', (dialect) => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => {
    await t?.close();
  });

  /** A merchant with a tiered meter whose base cost falls on the merchant, and funded customers. */
  async function setup(customers: number) {
    const m = await t.newMerchant('Charge core');
    await creditWallet(t.storage, m.walletId, parseMoney('10'), new Date().toISOString());
    const headers = t.auth(m.secretKey);
    const tiers = [{ start: 0, rate: '100' }, { start: 200, rate: '50' }];
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers,
        payload: { name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers, base_cost_payer: 'merchant' },
      })
    ).json<{ meter_id: string; meter_slug: string }>();
    const made: { id: string; walletId: string }[] = [];
    for (let i = 0; i < customers; i++) {
      const c = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json<{ customer_id: string; wallet: { wallet_id: string } }>();
      await creditWallet(t.storage, c.wallet.wallet_id, parseMoney('1'), new Date().toISOString());
      made.push({ id: c.customer_id, walletId: c.wallet.wallet_id });
    }
    return { m, meter, customers: made };
  }

  const prices = () => lookupBasePrices('openai', 'gpt-4o', { overrides: t.config.priceOverrides });
  const SERVICE_CHARGE_RATE = parseMoney('0.05');

  /** The legs of a record's request_charge, by account with its wallet's id named by role. */
  async function legsOf(recordId: string, walletRoles: Record<string, string>) {
    const rows = await t.storage.db
      .selectFrom('ledger_postings')
      .innerJoin('ledger_transactions', 'ledger_transactions.id', 'ledger_postings.transaction_id')
      .select(['ledger_postings.account', 'ledger_postings.amount', 'ledger_transactions.kind'])
      .where('ledger_transactions.reference', '=', recordId)
      .execute();
    expect(new Set(rows.map((r) => r.kind))).toEqual(new Set(['request_charge']));
    const named = rows.map((r) => ({
      account: Object.entries(walletRoles).reduce((account, [id, role]) => account.replace(id, role), r.account),
      amount: BigInt(r.amount),
    }));
    return named.sort((a, b) => (a.account < b.account ? -1 : 1));
  }

  /** The money columns of a completed record. */
  const moneyOf = (row: RequestRow) => ({
    status: row.status,
    input_cost: BigInt(row.input_cost),
    output_cost: BigInt(row.output_cost),
    base_cost_charged: Number(row.base_cost_charged),
    base_cost_payer: row.base_cost_payer,
    fee_amount: BigInt(row.fee_amount),
    breakdown: row.breakdown,
    service_charge_amount: BigInt(row.service_charge_amount),
    total_request_cost: BigInt(row.total_request_cost),
    total_wallet_cost: BigInt(row.total_wallet_cost),
    total_merchant_cost: BigInt(row.total_merchant_cost),
  });

  it('a settlement batch and a POST /requests batch of the same usage are priced, posted and split into ledger legs alike', async () => {
    const { m, meter, customers } = await setup(2);
    const [forwarded, recorded] = customers as [{ id: string; walletId: string }, { id: string; walletId: string }];
    // Three requests each: the third crosses the meter's tier start, so the tier positions count.
    const usages = [tokenUsage(60, 40), tokenUsage(60, 40), tokenUsage(60, 40)];

    // Forwarded: admitted, then settled together in one group-commit batch (settleInTransaction).
    const token = forwardToken(m.secretKey, forwarded.id, meter.meter_slug);
    const billing = await resolveForwardCredential(t.storage, token, new Date());
    const gatewayWriter = new GroupCommitWriter(t.storage);
    const facts = { provider: 'openai', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed' as const, metadata: { team: 'a' } };
    const admitted = await Promise.all(usages.map(() => gatewayWriter.run(ADMIT_JOB, admissionOf(billing, forwarded.walletId, { hold: '0.1', facts }))));
    const settled: ChargeOutcome[] = await Promise.all(
      admitted.map((a) => {
        if (a.outcome !== 'admitted') throw new Error(a.outcome);
        return gatewayWriter.run(
          SETTLE_JOB,
          settlementOf(a, { billing, usage: usages[0]!, prices: prices(), baseCostCharged: true, serviceChargeRate: SERVICE_CHARGE_RATE, record: facts }),
        );
      }),
    );

    // POST /requests: the same usage for the other customer, charged together in one batch (CHARGE_JOB).
    const input = async (i: number): Promise<ChargeInput> => ({ now: new Date(),
      merchant: (await findMerchant(t.storage, m.merchantId))!,
      connection: (await findConnection(t.storage, m.merchantId, recorded.id))!,
      meter: (await findMeter(t.storage, m.merchantId, meter.meter_id))!,
      requestId: `core-${i}`,
      bodyHash: null,
      usage: usages[i]!,
      provider: 'openai',
      model: 'gpt-4o',
      endpoint: 'POST /v1/requests',
      providerKeyType: 'managed',
      basePrices: prices(),
      serviceChargeRate: SERVICE_CHARGE_RATE,
      metadata: { team: 'a' },
    });
    const inputs = await Promise.all(usages.map((_u, i) => input(i)));
    const writer = chargeWriter(t.storage);
    const charged: BatchOutcome[] = await Promise.all(inputs.map((i) => writer.run(CHARGE_JOB, i)));

    const rowsOf = (outcomes: (ChargeOutcome | BatchOutcome)[]) =>
      outcomes.map((o) => {
        if (o.outcome !== 'recorded') throw new Error(o.outcome);
        return o.row;
      });
    const settledRows = rowsOf(settled);
    const chargedRows = rowsOf(charged);
    // The price is not trivial: a fee in two tiers, a base cost on the merchant and a service charge.
    expect(new Set(settledRows.map((r) => BigInt(r.fee_amount))).size).toBe(2);
    expect(BigInt(settledRows[0]!.input_cost)).toBeGreaterThan(0n);
    expect(BigInt(settledRows[0]!.service_charge_amount)).toBeGreaterThan(0n);
    expect(settledRows.map(moneyOf)).toEqual(chargedRows.map(moneyOf));

    for (let i = 0; i < usages.length; i++) {
      const settledLegs = await legsOf(settledRows[i]!.id, { [forwarded.walletId]: 'CUSTOMER', [m.walletId]: 'MERCHANT' });
      const chargedLegs = await legsOf(chargedRows[i]!.id, { [recorded.walletId]: 'CUSTOMER', [m.walletId]: 'MERCHANT' });
      expect(settledLegs.length).toBeGreaterThanOrEqual(4);
      expect(settledLegs).toEqual(chargedLegs);
    }
    expect((await findWallet(t.storage, forwarded.walletId))!.balance).toBe((await findWallet(t.storage, recorded.walletId))!.balance);
    expect((await findWallet(t.storage, forwarded.walletId))!.held).toBe(0n);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    await gatewayWriter.drain();
    await writer.drain();
  });

  it('a POST /requests batch writes one balance event per wallet it changed, with the balance the batch left', async () => {
    const { m, meter, customers } = await setup(1);
    const customer = customers[0]!;
    const events = (type: string) =>
      t.storage.db.selectFrom('events').select(['payload']).where('merchant_id', '=', m.merchantId).where('type', '=', type).orderBy('id').execute();
    const customerEventsBefore = (await events('customer.wallet.balance.updated')).length;
    const merchantEventsBefore = (await events('merchant.wallet.balance.updated')).length;

    const writer = chargeWriter(t.storage);
    const inputs: ChargeInput[] = [];
    for (let i = 0; i < 5; i++) {
      inputs.push({ now: new Date(),
        merchant: (await findMerchant(t.storage, m.merchantId))!,
        connection: (await findConnection(t.storage, m.merchantId, customer.id))!,
        meter: (await findMeter(t.storage, m.merchantId, meter.meter_id))!,
        requestId: `events-${i}`,
        bodyHash: null,
        usage: tokenUsage(100, 0),
        provider: 'openai',
        model: 'gpt-4o',
        endpoint: 'POST /v1/requests',
        providerKeyType: 'managed',
        basePrices: prices(),
        serviceChargeRate: 0n,
        metadata: {},
      });
    }
    // Handed in together: one batch, one transaction.
    const outcomes = await Promise.all(inputs.map((input) => writer.run(CHARGE_JOB, input)));
    expect(outcomes.map((o) => o.outcome)).toEqual(['recorded', 'recorded', 'recorded', 'recorded', 'recorded']);

    const customerEvents = (await events('customer.wallet.balance.updated')).slice(customerEventsBefore);
    const merchantEvents = (await events('merchant.wallet.balance.updated')).slice(merchantEventsBefore);
    // The customer paid the fee and the merchant the base cost: each wallet once, not once per request.
    expect(customerEvents.length).toBe(1);
    expect(merchantEvents.length).toBe(1);
    const customerWallet = (await findWallet(t.storage, customer.walletId))!;
    expect(customerWallet.balance).toBeLessThan(parseMoney('1'));
    expect(JSON.parse(customerEvents[0]!.payload)).toMatchObject({ customer_id: customer.id, wallet_id: customer.walletId, balance: formatMoney(customerWallet.balance) });
    expect(JSON.parse(merchantEvents[0]!.payload)).toMatchObject({ wallet_id: m.walletId, balance: formatMoney((await findWallet(t.storage, m.walletId))!.balance) });
    await writer.drain();
  });
});
