import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { setServiceChargeRate } from '../../src/storage/merchants.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest, priceOverridesFile } from '../helpers/databases.ts';

/**
 * Worked billing examples through POST /v1/requests. Every expected number is computed by hand in
 * the comment next to it (rules in docs/decisions/0002-pricing.md), never by the code under test.
 */

type Tier = { start: string | number; rate: string };
type MeterBody = {
  name: string;
  rate_type: 'fixed' | 'percentage';
  tier_type?: 'tokens_1m' | 'characters_1m' | 'minutes' | 'requests';
  token_basis?: 'input+output' | 'output';
  base_cost_payer?: 'wallet' | 'merchant';
  service_charge_payer?: 'wallet' | 'merchant';
  tiers: Tier[];
};
type BreakdownItem = {
  tier: { start: number; rate: string; type: string };
  tokens: number;
  characters: number;
  seconds: number;
  cost: string;
};
type RecordBody = {
  request_id: string;
  customer_id: string;
  connection_id: string;
  meter_id: string;
  product_id: string;
  model_usage: { input_cost: string; output_cost: string; total_cost: string; payer: string };
  fee: { amount: string; rate_type: string; token_basis: string; breakdown: BreakdownItem[] };
  charge: { amount: string; rate_type: string; breakdown: BreakdownItem[] };
  cost: string;
  service_charge: { amount: string; payer: string };
  total_request_cost: string;
  total_wallet_cost: string;
  total_merchant_cost: string;
  created_at: string;
  timestamp: string | null;
};

/** A money string exactly as the API prints it: "0.0045" → "0.0045000000". */
const money = (decimal: string) => formatMoney(parseMoney(decimal));

/** Both vocabularies on one record, and the payer identity request = wallet + merchant. */
function expectConsistentRecord(r: RecordBody): void {
  expect(r.customer_id).toBe(r.connection_id);
  expect(r.meter_id).toBe(r.product_id);
  expect(r.cost).toBe(r.model_usage.total_cost);
  expect(r.charge.amount).toBe(r.fee.amount);
  expect(r.charge.rate_type).toBe(r.fee.rate_type);
  expect(r.charge.breakdown).toEqual(r.fee.breakdown);
  expect(parseMoney(r.total_request_cost)).toBe(parseMoney(r.total_wallet_cost) + parseMoney(r.total_merchant_cost));
  expect(parseMoney(r.model_usage.total_cost)).toBe(parseMoney(r.model_usage.input_cost) + parseMoney(r.model_usage.output_cost));
  const slices = r.fee.breakdown.reduce((sum, item) => sum + parseMoney(item.cost), 0n);
  expect(parseMoney(r.fee.amount)).toBe(slices);
}

describe.each(databasesUnderTest())('billing examples through POST /v1/requests on %s', (dialect) => {
  let t: TestApp;
  let configured: TestApp;
  const apps = () => [t, configured].filter(Boolean);

  beforeAll(async () => {
    t = await startTestApp(dialect);
    // Operator settings: a 10 % service charge and a price for a model the catalog does not know.
    const overrides = priceOverridesFile({ 'acme/custom-1': { input: '1', output: '4' } });
    configured = await startTestApp(dialect, { env: { SERVICE_CHARGE_RATE: '10', PRICE_OVERRIDES_FILE: overrides } });
  });
  afterAll(async () => {
    await t?.close();
    await configured?.close();
  });
  afterEach(async () => {
    for (const app of apps()) expect((await verifyLedger(app.storage)).problems).toEqual([]);
  });

  let sequence = 0;

  /** A fresh merchant with one customer (funded with `fund`) and one meter. */
  async function scenario(meterBody: MeterBody, opts: { app?: TestApp; fund?: string } = {}) {
    const app = opts.app ?? t;
    const merchant: Merchant = await app.newMerchant();
    const headers = app.auth(merchant.secretKey);
    const customer = (await app.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: { name: 'Ada' } })).json<{
      customer_id: string;
      connection_secret: string;
      wallet: { wallet_id: string };
    }>();
    const meterRes = await app.app.inject({ method: 'POST', url: '/v1/meters', headers, payload: meterBody });
    expect(meterRes.statusCode, meterRes.body).toBe(201);
    const meter = meterRes.json<{ meter_id: string; meter_slug: string; product_secret: string }>();
    const fund = opts.fund ?? '100';
    if (parseMoney(fund) > 0n) await creditWallet(app.storage, customer.wallet.wallet_id, parseMoney(fund), new Date().toISOString());
    const post = (body: object) =>
      app.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers,
        payload: { request_id: `ex-${++sequence}`, customer_id: customer.customer_id, meter_slug: meter.meter_slug, ...body },
      });
    /** Records a request that must succeed and returns the record, checked for internal consistency. */
    const charge = async (body: object): Promise<RecordBody> => {
      const res = await post(body);
      expect(res.statusCode, res.body).toBe(201);
      const record = res.json<RecordBody>();
      expectConsistentRecord(record);
      expect(record.customer_id).toBe(customer.customer_id);
      expect(record.meter_id).toBe(meter.meter_id);
      return record;
    };
    const balance = async (walletId = customer.wallet.wallet_id) => formatMoney((await findWallet(app.storage, walletId))!.balance);
    return { app, merchant, headers, customer, meter, post, charge, balance };
  }

  it('fixed tokens_1m (input+output): rate per million tokens of input and output', async () => {
    const s = await scenario({ name: 'Tokens', rate_type: 'fixed', tiers: [{ start: '0', rate: '3.5' }] });
    const r = await s.charge({ input_tokens: 123_456, output_tokens: 7_890 });
    // (123 456 + 7 890) tokens = 131 346 × 3.5 / 1 000 000 = 0.459711
    expect(r.fee).toEqual({
      amount: '0.4597110000',
      rate_type: 'fixed',
      token_basis: 'input+output',
      breakdown: [
        {
          tier: { start: 0, rate: '3.5000000000', type: 'tokens_1m' },
          tokens: 131_346,
          characters: 0,
          seconds: 0,
          cost: '0.4597110000',
        },
      ],
    });
    // No provider named: base cost 0; no service charge by default.
    expect(r.cost).toBe('0.0000000000');
    expect(r.service_charge.amount).toBe('0.0000000000');
    expect([r.total_request_cost, r.total_wallet_cost, r.total_merchant_cost]).toEqual(['0.4597110000', '0.4597110000', '0.0000000000']);
    // 100 − 0.459711 = 99.540289
    expect(await s.balance()).toBe('99.5402890000');
  });

  it('fixed tokens_1m with token_basis output: only output tokens are billed', async () => {
    const s = await scenario({ name: 'Output', rate_type: 'fixed', token_basis: 'output', tiers: [{ start: 0, rate: '10' }] });
    const r = await s.charge({ input_tokens: 100_000, output_tokens: 2_345 });
    // 2 345 output tokens × 10 / 1 000 000 = 0.02345; the 100 000 input tokens cost nothing
    expect(r.fee.token_basis).toBe('output');
    expect(r.fee.amount).toBe('0.0234500000');
    expect(r.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '10.0000000000', type: 'tokens_1m' }, tokens: 2_345, characters: 0, seconds: 0, cost: '0.0234500000' },
    ]);
    expect(r.total_wallet_cost).toBe('0.0234500000');
  });

  it('fixed characters_1m: input + output characters per million', async () => {
    const s = await scenario({ name: 'TTS', rate_type: 'fixed', tier_type: 'characters_1m', tiers: [{ start: 0, rate: '20' }] });
    const r = await s.charge({ input_characters: 1_234, output_characters: 5_678, input_tokens: 999 });
    // (1 234 + 5 678) characters = 6 912 × 20 / 1 000 000 = 0.13824; tokens do not count
    expect(r.fee.amount).toBe('0.1382400000');
    expect(r.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '20.0000000000', type: 'characters_1m' }, tokens: 0, characters: 6_912, seconds: 0, cost: '0.1382400000' },
    ]);
    expect(r.total_request_cost).toBe('0.1382400000');
  });

  it('fixed minutes: input_seconds + output_seconds priced per minute, rounded half-up once', async () => {
    const s = await scenario({ name: 'STT', rate_type: 'fixed', tier_type: 'minutes', tiers: [{ start: 0, rate: '0.06' }] });
    const a = await s.charge({ input_seconds: 45.25, output_seconds: 30 });
    // 75.25 s = 75.25 / 60 min × 0.06 = 75.25 × 0.001 = 0.07525
    expect(a.fee.amount).toBe('0.0752500000');
    expect(a.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '0.0600000000', type: 'minutes' }, tokens: 0, characters: 0, seconds: 75.25, cost: '0.0752500000' },
    ]);

    const cheap = await scenario({ name: 'STT 7', rate_type: 'fixed', tier_type: 'minutes', tiers: [{ start: 0, rate: '0.07' }] });
    const b = await cheap.charge({ input_seconds: 1 });
    // 1 s = 0.07 / 60 = 0.00116666666…6 → half-up at 10 places: 0.0011666667
    expect(b.fee.amount).toBe('0.0011666667');
    expect(b.total_wallet_cost).toBe('0.0011666667');
  });

  it('minutes tiers start in minutes: 90 s from 0 pays 60 s at tier 0 and 30 s at the tier starting at minute 1', async () => {
    const s = await scenario({
      name: 'STT tiers',
      rate_type: 'fixed',
      tier_type: 'minutes',
      tiers: [
        { start: 0, rate: '0.1' },
        { start: 1, rate: '0.05' },
      ],
    });
    const r = await s.charge({ input_seconds: 80, output_seconds: 10 });
    // [0 s, 60 s): 1 min × 0.1 = 0.1 ; [60 s, 90 s): 0.5 min × 0.05 = 0.025 ; fee 0.125
    expect(r.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '0.1000000000', type: 'minutes' }, tokens: 0, characters: 0, seconds: 60, cost: '0.1000000000' },
      { tier: { start: 1, rate: '0.0500000000', type: 'minutes' }, tokens: 0, characters: 0, seconds: 30, cost: '0.0250000000' },
    ]);
    expect(r.fee.amount).toBe('0.1250000000');
  });

  it('fixed requests: one unit per request whatever the usage; the slice shows the whole usage', async () => {
    const s = await scenario({ name: 'Calls', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.25' }] });
    const r = await s.charge({ input_tokens: 10, output_tokens: 5, input_characters: 7, output_seconds: 2.5 });
    // 1 request × 0.25 = 0.25
    expect(r.fee.amount).toBe('0.2500000000');
    expect(r.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '0.2500000000', type: 'requests' }, tokens: 15, characters: 7, seconds: 2.5, cost: '0.2500000000' },
    ]);
    const empty = await s.charge({});
    // Still one request: 0.25, whatever (no) usage it had
    expect(empty.fee.amount).toBe('0.2500000000');
    // 100 − 0.25 − 0.25
    expect(await s.balance()).toBe('99.5000000000');
  });

  it('percentage of the catalog base cost (openai/gpt-4o), base cost paid by the wallet', async () => {
    // Bundled catalog: gpt-4o input 2.5, output 10 per 1M tokens (test/unit/base-prices.test.ts).
    expect(lookupBasePrices('openai', 'gpt-4o')).toMatchObject({ input: parseMoney('2.5'), output: parseMoney('10') });
    const s = await scenario({ name: 'Markup', rate_type: 'percentage', tiers: [{ start: 0, rate: '10' }] });
    const r = await s.charge({ provider: 'openai', model: 'gpt-4o', input_tokens: 1_000, output_tokens: 500 });
    // input 1 000 × 2.5 / 1M = 0.0025 ; output 500 × 10 / 1M = 0.005 ; base 0.0075
    expect(r.model_usage).toMatchObject({ input_cost: '0.0025000000', output_cost: '0.0050000000', total_cost: '0.0075000000', payer: 'wallet' });
    expect(r.cost).toBe('0.0075000000');
    // fee = 10 % × 0.0075 (basis input+output) = 0.00075, one slice holding all 1 500 tokens
    expect(r.fee).toEqual({
      amount: '0.0007500000',
      rate_type: 'percentage',
      token_basis: 'input+output',
      breakdown: [
        { tier: { start: 0, rate: '10.0000000000', type: 'tokens_1m' }, tokens: 1_500, characters: 0, seconds: 0, cost: '0.0007500000' },
      ],
    });
    // wallet pays base + fee = 0.0075 + 0.00075 = 0.00825
    expect([r.total_request_cost, r.total_wallet_cost, r.total_merchant_cost]).toEqual(['0.0082500000', '0.0082500000', '0.0000000000']);
    expect(await s.balance()).toBe('99.9917500000');
  });

  it('percentage on a tier boundary shares the base cost pro rata between the two slices', async () => {
    const s = await scenario({
      name: 'Markup tiers',
      rate_type: 'percentage',
      tiers: [
        { start: 0, rate: '20' },
        { start: 1_000, rate: '10' },
      ],
    });
    const r = await s.charge({ provider: 'openai', model: 'gpt-4o', input_tokens: 1_200, output_tokens: 800 });
    // base: 1 200 × 2.5 / 1M = 0.003 ; 800 × 10 / 1M = 0.008 ; total 0.011 over 2 000 tokens
    // slice [0, 1000):   20 % × 0.011 × 1000/2000 = 0.0011
    // slice [1000, 2000): 10 % × 0.011 × 1000/2000 = 0.00055 ; fee 0.00165
    expect(r.fee.breakdown.map((b) => [b.tier.start, b.tokens, b.cost])).toEqual([
      [0, 1_000, '0.0011000000'],
      [1_000, 1_000, '0.0005500000'],
    ]);
    expect(r.fee.amount).toBe('0.0016500000');
    // 0.011 + 0.00165
    expect(r.total_wallet_cost).toBe('0.0126500000');
  });

  it('percentage of an operator-priced custom model (PRICE_OVERRIDES_FILE), token basis output', async () => {
    const s = await scenario(
      { name: 'Custom', rate_type: 'percentage', token_basis: 'output', tiers: [{ start: 0, rate: '20' }] },
      { app: configured },
    );
    await setServiceChargeRate(configured.storage, s.merchant.merchantId, 0n);
    const r = await s.charge({ provider: 'acme', model: 'custom-1', input_tokens: 2_000, output_tokens: 3_000 });
    // override acme/custom-1: input 1, output 4 per 1M
    // input 2 000 × 1 / 1M = 0.002 ; output 3 000 × 4 / 1M = 0.012 ; base 0.014
    expect(r.model_usage).toMatchObject({ input_cost: '0.0020000000', output_cost: '0.0120000000', total_cost: '0.0140000000' });
    // fee = 20 % × output cost 0.012 = 0.0024 over the 3 000 output tokens
    expect(r.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '20.0000000000', type: 'tokens_1m' }, tokens: 3_000, characters: 0, seconds: 0, cost: '0.0024000000' },
    ]);
    // total 0.014 + 0.0024 = 0.0164 (service charge overridden to 0 for this merchant)
    expect(r.total_request_cost).toBe('0.0164000000');
    expect(r.service_charge.amount).toBe('0.0000000000');

    // Without the override file the model is unknown: base cost 0, so a percentage fee is 0.
    const plain = await scenario({ name: 'Custom', rate_type: 'percentage', token_basis: 'output', tiers: [{ start: 0, rate: '20' }] });
    const unknown = await plain.charge({ provider: 'acme', model: 'custom-1', input_tokens: 2_000, output_tokens: 3_000 });
    expect([unknown.cost, unknown.fee.amount, unknown.total_request_cost]).toEqual(['0.0000000000', '0.0000000000', '0.0000000000']);
  });

  it('a request crossing two tier boundaries is priced in three slices; the next continues at the accumulated position', async () => {
    const s = await scenario({
      name: 'Graduated',
      rate_type: 'fixed',
      tiers: [
        { start: 0, rate: '10' },
        { start: 1_000, rate: '5' },
        { start: 3_000, rate: '2' },
      ],
    });
    const first = await s.charge({ input_tokens: 400, output_tokens: 100 });
    // positions [0, 500) in tier 0: 500 × 10 / 1M = 0.005
    expect(first.fee.breakdown.map((b) => [b.tier.start, b.tokens, b.cost])).toEqual([[0, 500, '0.0050000000']]);

    const crossing = await s.charge({ input_tokens: 2_000, output_tokens: 1_000 });
    // positions [500, 3500):
    //   [500, 1000)   tier 0:   500 × 10 / 1M = 0.005
    //   [1000, 3000)  tier 1: 2 000 ×  5 / 1M = 0.01
    //   [3000, 3500)  tier 2:   500 ×  2 / 1M = 0.001   → fee 0.016
    expect(crossing.fee.breakdown).toEqual([
      { tier: { start: 0, rate: '10.0000000000', type: 'tokens_1m' }, tokens: 500, characters: 0, seconds: 0, cost: '0.0050000000' },
      { tier: { start: 1_000, rate: '5.0000000000', type: 'tokens_1m' }, tokens: 2_000, characters: 0, seconds: 0, cost: '0.0100000000' },
      { tier: { start: 3_000, rate: '2.0000000000', type: 'tokens_1m' }, tokens: 500, characters: 0, seconds: 0, cost: '0.0010000000' },
    ]);
    expect(crossing.fee.amount).toBe('0.0160000000');
    expect(crossing.total_wallet_cost).toBe('0.0160000000');

    const next = await s.charge({ input_tokens: 100 });
    // position 3 500 is in tier 2: 100 × 2 / 1M = 0.0002
    expect(next.fee.breakdown.map((b) => [b.tier.start, b.tokens, b.cost])).toEqual([[3_000, 100, '0.0002000000']]);
    // 100 − 0.005 − 0.016 − 0.0002 = 99.9788
    expect(await s.balance()).toBe('99.9788000000');

    // The position is per customer: another customer of the same meter starts at tier 0 again.
    const other = (await s.app.app.inject({ method: 'POST', url: '/v1/customers', headers: s.headers, payload: {} })).json();
    await creditWallet(s.app.storage, other.wallet.wallet_id, parseMoney('1'), new Date().toISOString());
    const fresh = await s.app.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: s.headers,
      payload: { request_id: 'graduated-other', customer_id: other.customer_id, meter_slug: s.meter.meter_slug, input_tokens: 100 },
    });
    // 100 × 10 / 1M = 0.001
    expect(fresh.json().fee.breakdown.map((b: BreakdownItem) => [b.tier.start, b.cost])).toEqual([[0, '0.0010000000']]);
  });

  it('base_cost_payer merchant: the merchant wallet pays the base cost, the customer only the fee', async () => {
    const s = await scenario({
      name: 'Merchant pays model',
      rate_type: 'fixed',
      base_cost_payer: 'merchant',
      tiers: [{ start: 0, rate: '1' }],
    });
    await creditWallet(t.storage, s.merchant.walletId, parseMoney('1'), new Date().toISOString());
    const r = await s.charge({ provider: 'openai', model: 'gpt-4o', input_tokens: 10_000, output_tokens: 2_000 });
    // base: 10 000 × 2.5 / 1M = 0.025 ; 2 000 × 10 / 1M = 0.02 ; total 0.045 → merchant
    // fee: 12 000 × 1 / 1M = 0.012 → wallet ; request = 0.057
    expect(r.model_usage).toMatchObject({ total_cost: '0.0450000000', payer: 'merchant' });
    expect(r.fee.amount).toBe('0.0120000000');
    expect([r.total_request_cost, r.total_wallet_cost, r.total_merchant_cost]).toEqual(['0.0570000000', '0.0120000000', '0.0450000000']);
    // customer 100 − 0.012 ; merchant 1 − 0.045
    expect(await s.balance()).toBe('99.9880000000');
    expect(await s.balance(s.merchant.walletId)).toBe('0.9550000000');
  });

  it('base_cost_payer merchant: 402 when the merchant wallet cannot pay, and nothing is recorded', async () => {
    const s = await scenario({
      name: 'Merchant pays model',
      rate_type: 'fixed',
      base_cost_payer: 'merchant',
      tiers: [
        { start: 0, rate: '1' },
        { start: 5_000, rate: '100' },
      ],
    });
    // 0.04 is short of the 0.045 base cost below.
    await creditWallet(t.storage, s.merchant.walletId, parseMoney('0.04'), new Date().toISOString());
    const before = await verifyLedger(t.storage);
    const refused = await s.post({ request_id: 'merchant-short', provider: 'openai', model: 'gpt-4o', input_tokens: 10_000, output_tokens: 2_000 });
    expect(refused.statusCode).toBe(402);
    expect(refused.json().error).toMatchObject({ code: 'insufficient_balance', status: 402 });
    expect(refused.json().error.message).toContain('merchant');

    expect((await s.app.app.inject({ method: 'GET', url: '/v1/requests/merchant-short', headers: s.headers })).statusCode).toBe(404);
    expect(await s.balance()).toBe('100.0000000000');
    expect(await s.balance(s.merchant.walletId)).toBe('0.0400000000');
    expect((await verifyLedger(t.storage)).transactions).toBe(before.transactions);
    const events = await t.storage.db
      .selectFrom('events')
      .select('type')
      .where('merchant_id', '=', s.merchant.merchantId)
      .where('type', 'like', '%wallet.balance.updated')
      .execute();
    // Only the two operator credits wrote balance events.
    expect(events.map((e) => e.type).sort()).toEqual(['customer.wallet.balance.updated', 'merchant.wallet.balance.updated']);

    // The refused request did not advance the tier position: after funding, 12 000 tokens still
    // start at position 0 → [0, 5000) × 1 + [5000, 12000) × 100 = 0.005 + 0.7 = 0.705
    await creditWallet(t.storage, s.merchant.walletId, parseMoney('1'), new Date().toISOString());
    const r = await s.charge({ request_id: 'merchant-short', provider: 'openai', model: 'gpt-4o', input_tokens: 10_000, output_tokens: 2_000 });
    expect(r.fee.breakdown.map((b) => [b.tier.start, b.tokens, b.cost])).toEqual([
      [0, 5_000, '0.0050000000'],
      [5_000, 7_000, '0.7000000000'],
    ]);
    expect(r.total_merchant_cost).toBe('0.0450000000');
    // 1.04 − 0.045
    expect(await s.balance(s.merchant.walletId)).toBe('0.9950000000');
  });

  it('service charge: SERVICE_CHARGE_RATE % of the fee, paid by service_charge_payer; per-merchant override wins', async () => {
    const s = await scenario(
      { name: 'Calls', rate_type: 'fixed', tier_type: 'requests', service_charge_payer: 'merchant', tiers: [{ start: 0, rate: '2' }] },
      { app: configured },
    );
    await creditWallet(configured.storage, s.merchant.walletId, parseMoney('1'), new Date().toISOString());
    const r = await s.charge({});
    // fee 2 → wallet ; service charge 10 % × 2 = 0.2 → merchant ; request 2.2
    expect(r.service_charge).toEqual({ amount: '0.2000000000', payer: 'merchant' });
    expect([r.total_request_cost, r.total_wallet_cost, r.total_merchant_cost]).toEqual(['2.2000000000', '2.0000000000', '0.2000000000']);
    expect(await s.balance(s.merchant.walletId)).toBe('0.8000000000');

    await setServiceChargeRate(configured.storage, s.merchant.merchantId, parseMoney('2.5'));
    const overridden = await s.charge({});
    // 2.5 % × 2 = 0.05
    expect(overridden.service_charge.amount).toBe('0.0500000000');
    expect([overridden.total_request_cost, overridden.total_wallet_cost, overridden.total_merchant_cost]).toEqual([
      '2.0500000000',
      '2.0000000000',
      '0.0500000000',
    ]);
    // 0.8 − 0.05 ; customer 100 − 2 − 2
    expect(await s.balance(s.merchant.walletId)).toBe('0.7500000000');
    expect(await s.balance()).toBe('96.0000000000');

    // Merchant cannot pay the service charge: 402, nothing recorded.
    await setServiceChargeRate(configured.storage, s.merchant.merchantId, parseMoney('50'));
    const refused = await s.post({ request_id: 'sc-short' });
    // 50 % × 2 = 1 > 0.75
    expect(refused.statusCode).toBe(402);
    expect(await s.balance()).toBe('96.0000000000');
  });

  it('service charge paid by the wallet, rounded half-up once', async () => {
    const s = await scenario(
      { name: 'Tiny', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.0000000015' }] },
      { app: configured },
    );
    const r = await s.charge({});
    // fee 0.0000000015 ; 10 % = 0.00000000015 → half-up → 0.0000000002 ; wallet 0.0000000017
    expect(r.service_charge).toEqual({ amount: '0.0000000002', payer: 'wallet' });
    expect([r.total_request_cost, r.total_wallet_cost, r.total_merchant_cost]).toEqual(['0.0000000017', '0.0000000017', '0.0000000000']);
  });

  it('the older body (connection_secret + product_secret) is priced exactly like the newer body', async () => {
    const s = await scenario({
      name: 'Both',
      rate_type: 'percentage',
      token_basis: 'output',
      tiers: [{ start: 0, rate: '15' }],
    });
    const usage = { provider: 'openai', model: 'gpt-4o', input_tokens: 3_000, output_tokens: 1_234 };
    const newer = await s.charge({ request_id: 'newer', ...usage });
    const olderRes = await s.app.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: s.headers,
      payload: { request_id: 'older', connection_secret: s.customer.connection_secret, product_secret: s.meter.product_secret, ...usage },
    });
    expect(olderRes.statusCode, olderRes.body).toBe(201);
    const older = olderRes.json<RecordBody>();
    expectConsistentRecord(older);
    // input 3 000 × 2.5 / 1M = 0.0075 ; output 1 234 × 10 / 1M = 0.01234 ; base 0.01984
    // fee 15 % × 0.01234 = 0.001851 ; wallet 0.01984 + 0.001851 = 0.021691
    expect(newer.total_wallet_cost).toBe(money('0.021691'));
    expect(newer.fee.amount).toBe(money('0.001851'));
    const comparable = (r: RecordBody) => ({ ...r, request_id: undefined, created_at: undefined, timestamp: undefined });
    expect(comparable(older)).toEqual(comparable(newer));
    // 100 − 2 × 0.021691
    expect(await s.balance()).toBe('99.9566180000');
  });
});
