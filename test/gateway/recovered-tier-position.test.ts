import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';
import { admissionOf } from '../helpers/settle.ts';

/**
 * A request recovered from its hold estimate (its settlement never came, decision 0019) takes its
 * place in its meter's tiers as its settlement would have: the customer's next request is priced
 * at the tier after it.
 */
const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;
const body = { model: 'gpt-4o', max_tokens: 20, messages: [{ role: 'user', content: 'priced by the request' }] };
// The first request of the month costs 0.1, every later one 0.01.
const TIERED = { name: 'Tiered', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.1' }, { start: 1, rate: '0.01' }] };

describe.each(databasesUnderTest())('a recovered request advances its tier position, on %s', (dialect) => {
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

  it("charges the recovered request the first tier's price and the customer's next request the second tier's", async () => {
    const customer = await t.customerWithMeter({ credit: '5', meter: TIERED });
    const token = Buffer.from(JSON.stringify({ secret_key: t.merchant.secretKey, customer_id: customer.customerId, meter_slug: customer.meterSlug })).toString('base64');
    const billing = await resolveForwardCredential(t.storage, token, new Date(t.clock.now()));
    const estimate = estimateHold({
      requestBody: body,
      pricing: pricingFor(billing).pricing,
      prices: lookupBasePrices('openai', body.model, { overrides: t.config.priceOverrides }),
      baseCostCharged: true,
      serviceChargeRate: t.config.serviceChargeRate,
      defaultOutputCap: t.config.defaultMaxOutputTokens,
    });
    // Admitted, then its instance died: nothing renews its hold, and the sweep finds it past its TTL.
    const admitted = await admitRequest(t.storage, { ...admissionOf(billing, customer.walletId, { hold: '0', ttlMs: 60_000 }), estimate });
    expect(admitted.outcome).toBe('admitted');
    const { recordId } = admitted as { recordId: string };
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
});
