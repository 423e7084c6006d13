import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/ids.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { failRequest, settleRequest, type SettleInput } from '../../src/ledger/settlement/settle.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { Merchant, TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Admission and holds over real HTTP (DESIGN §7): a request is admitted only when the paying
 * wallet's available balance (balance − active holds) covers its hold estimate, checked atomically
 * under concurrency, and refused with 402 before any provider call otherwise. Holds expire (swept
 * by sweepExpiredHolds, which marks the record `error`) and settlement happens once.
 *
 * The hold estimate is computed here with the gateway's own functions (estimateHold with the
 * request's max_tokens as output cap, the model's base prices, the payer's pricing), so the
 * wallets can be funded for exactly N requests.
 *
 * The bound on a negative balance: an admitted request is charged its actual cost even when that
 * exceeds its hold, so a wallet can end below zero, but only by (actual − hold) of the requests
 * admitted against it; the mock counts one input token per word while the estimate counts one per
 * four characters, which lets a test make actual > hold on purpose.
 */

type Envelope = { error: { code: string } };

const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;

describe.each(databasesUnderTest())('forward gateway admission and holds on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-managed-openai' },
      env: {
        HOLD_TTL_MS: '1000',
      },
    }));
  });
  afterEach(() => upstream.reset());
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  async function record(requestId: string, merchant: Merchant) {
    return (await t.app.inject({ method: 'GET', url: `/v1/requests/${requestId}`, headers: t.auth(merchant.secretKey) })).json();
  }
  const wallet = async (id: string) => (await findWallet(t.storage, id))!;
  const noActiveHolds = async (walletId: string) =>
    (await t.storage.db.selectFrom('holds').select('id').where('wallet_id', '=', walletId).where('status', '=', 'active').execute()).length === 0;

  function post(credential: string, body: string): Promise<Response> {
    return fetch(`${base}/v1/forward?${OPENAI_CHAT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json' },
      body,
    });
  }

  /** The hold the gateway places for `body` paid with `credential`, computed with its own functions. */
  async function holdFor(credential: string, body: string): Promise<bigint> {
    const billing = await resolveForwardCredential(t.storage, credential, new Date());
    const requestBody = JSON.parse(body) as { model: string };
    const estimate = estimateHold({
      requestBody,
      pricing: pricingFor(billing).pricing,
      prices: lookupBasePrices('openai', requestBody.model, { overrides: t.config.priceOverrides }),
      baseCostCharged: billing.providerKey === null,
      serviceChargeRate: billing.serviceChargeRate ?? t.config.serviceChargeRate,
      defaultOutputCap: t.config.defaultMaxOutputTokens,
    });
    return estimate.wallet + estimate.merchant;
  }

  /** A fresh merchant with a customer on a meter with a fee: both payer shapes are available. */
  async function until(check: () => Promise<boolean>): Promise<void> {
    for (let i = 0; i < 300 && !(await check()); i++) await sleep(10);
    expect(await check()).toBe(true);
  }

  async function freshPayers() {
    const merchant = await t.newMerchant('Race');
    const h = t.auth(merchant.secretKey);
    const customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: {} })).json() as {
      customer_id: string;
      wallet: { wallet_id: string };
    };
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '50' }] },
      })
    ).json() as { meter_slug: string };
    const token = Buffer.from(
      JSON.stringify({ secret_key: merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug }),
    ).toString('base64');
    return { merchant, customerWalletId: customer.wallet.wallet_id, token };
  }

  const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 2000, messages: [{ role: 'user', content: 'one two three four five six seven eight' }] });

  describe.each([
    ['the merchant pays (raw secret key)', 'merchant', 1],
    ['the merchant pays (raw secret key)', 'merchant', 3],
    ['a customer pays (forward token)', 'customer', 1],
    ['a customer pays (forward token)', 'customer', 3],
  ] as const)('20 concurrent requests when %s and the wallet covers %i hold(s)', (_name, payer, affordable) => {
    it('admits exactly what the holds allow; the rest are 402 without a provider call', async () => {
      const payers = await freshPayers();
      const credential = payer === 'merchant' ? payers.merchant.secretKey : payers.token;
      const walletId = payer === 'merchant' ? payers.merchant.walletId : payers.customerWalletId;
      const hold = await holdFor(credential, body);
      expect(hold).toBeGreaterThan(0n);
      // Room for `affordable` holds and half of another: never two more.
      const funded = hold * BigInt(affordable) + hold / 2n;
      await creditWallet(t.storage, walletId, funded);

      // Slow answers: no admitted request settles (freeing hold − actual) while the others queue.
      upstream.setNext({ path: '/chat/completions', delayMs: 800, times: 20 });
      const before = upstream.requests.length;
      const responses = await Promise.all(Array.from({ length: 20 }, () => post(credential, body)));
      const results = await Promise.all(
        responses.map(async (res) => ({ status: res.status, id: res.headers.get('x-tollgate-request-id'), text: await res.text() })),
      );

      const admitted = results.filter((r) => r.status === 200);
      const refused = results.filter((r) => r.status === 402);
      expect(admitted.length).toBe(affordable);
      expect(refused.length).toBe(20 - affordable);
      for (const r of refused) {
        expect((JSON.parse(r.text) as Envelope).error.code).toBe('insufficient_balance');
        expect(r.id).toMatch(/^req_/);
        // A refused request leaves no record.
        expect((await t.app.inject({ method: 'GET', url: `/v1/requests/${r.id}`, headers: t.auth(payers.merchant.secretKey) })).statusCode).toBe(404);
      }
      expect(upstream.requests.length - before).toBe(affordable);

      let actualTotal = 0n;
      let excess = 0n;
      for (const r of admitted) {
        const rec = await t.settledRecord(r.id!, t.auth(payers.merchant.secretKey));
        expect(rec.status).toBe('completed');
        const actual = parseMoney(rec.total_wallet_cost) + (payer === 'merchant' ? parseMoney(rec.total_merchant_cost) : 0n);
        expect(actual).toBeGreaterThan(0n);
        actualTotal += actual;
        if (actual > hold) excess += actual - hold;
      }
      const after = await wallet(walletId);
      expect(after.held).toBe(0n);
      expect(after.balance).toBe(funded - actualTotal);
      // DESIGN §7: below zero only by what admitted requests cost beyond their holds.
      expect(after.balance).toBeGreaterThanOrEqual(-excess);
      expect(await noActiveHolds(walletId)).toBe(true);
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });
  });

  it('a wallet at zero gets 402 before any provider call, for every placement', async () => {
    const { merchant, token } = await freshPayers();
    const before = upstream.requests.length;
    for (const credential of [merchant.secretKey, token]) {
      for (const headers of [{ authorization: `Bearer ${credential}` }, { 'x-api-key': credential }] as Record<string, string>[]) {
        const res = await fetch(`${base}/v1/forward?${OPENAI_CHAT}`, {
          method: 'POST',
          headers: { ...headers, 'content-type': 'application/json' },
          body,
        });
        expect(res.status).toBe(402);
        expect(((await res.json()) as Envelope).error.code).toBe('insufficient_balance');
        expect(res.headers.get('x-tollgate-request-id')).toMatch(/^req_/);
      }
    }
    // Streaming requests too.
    const res = await post(merchant.secretKey, JSON.stringify({ ...JSON.parse(body), stream: true }));
    expect(res.status).toBe(402);
    await res.arrayBuffer();
    expect(upstream.requests.length).toBe(before);
  });

  it('a request that cannot pay for its own max_tokens is refused even though a smaller one would fit', async () => {
    const { merchant } = await freshPayers();
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
    const large = JSON.stringify({ model: 'gpt-4o', max_tokens: 100_000, messages: [{ role: 'user', content: 'hi' }] });
    const smallHold = await holdFor(merchant.secretKey, small);
    expect(await holdFor(merchant.secretKey, large)).toBeGreaterThan(smallHold * 2n);
    await creditWallet(t.storage, merchant.walletId, smallHold * 2n);
    const before = upstream.requests.length;
    const refused = await post(merchant.secretKey, large);
    expect(refused.status).toBe(402);
    await refused.arrayBuffer();
    expect(upstream.requests.length).toBe(before);
    const ok = await post(merchant.secretKey, small);
    expect(ok.status).toBe(200);
    await ok.arrayBuffer();
    await t.settledRecord(ok.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
  });

  it('an admitted request that costs more than its hold ends below zero by exactly the excess; then 402 until credited', async () => {
    const { merchant } = await freshPayers();
    // The hold bounds what the request can cost; a provider reporting 40 times its usage costs more.
    const costly = JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: Array(300).fill('a').join(' ') }] });
    const hold = await holdFor(merchant.secretKey, costly);
    await creditWallet(t.storage, merchant.walletId, hold);

    upstream.setNext({ path: '/chat/completions', overReport: 40 });
    const res = await post(merchant.secretKey, costly);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const rec = await t.settledRecord(res.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    const actual = parseMoney(rec.total_merchant_cost) + parseMoney(rec.total_wallet_cost);
    expect(actual).toBeGreaterThan(hold);
    const after = await wallet(merchant.walletId);
    expect(after.balance).toBe(hold - actual);
    expect(after.balance).toBeLessThan(0n);
    expect(after.balance).toBeGreaterThanOrEqual(-(actual - hold));
    expect(after.held).toBe(0n);

    const before = upstream.requests.length;
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] });
    const refused = await post(merchant.secretKey, small);
    expect(refused.status).toBe(402);
    await refused.arrayBuffer();
    expect(upstream.requests.length).toBe(before);

    await creditWallet(t.storage, merchant.walletId, actual - hold + (await holdFor(merchant.secretKey, small)) * 2n);
    const ok = await post(merchant.secretKey, small);
    expect(ok.status).toBe(200);
    await ok.arrayBuffer();
    await t.settledRecord(ok.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  /**
   * An overrun wallet refuses `payload` without calling the provider while `slow` is in flight;
   * once `slow` is answered and settled, nothing is in flight: it admits again and the overrun is over.
   */
  async function expectRefusedUntilSettled(merchant: Merchant, payload: string, slow: Promise<Response>, answerSlow: () => void) {
    const before = upstream.requests.length;
    const refused = await post(merchant.secretKey, payload);
    expect(refused.status).toBe(402);
    await refused.arrayBuffer();
    expect(upstream.requests.length).toBe(before);

    answerSlow();
    const answered = await slow;
    await t.settledRecord(answered.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    const ok = await post(merchant.secretKey, payload);
    expect(ok.status).toBe(200);
    await t.settledRecord(ok.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect(Number((await wallet(merchant.walletId)).overrun)).toBe(0);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  }

  it('a wallet whose settled charge exceeded its hold admits nothing more until its requests in flight have settled (decision 0019)', async () => {
    const { merchant } = await freshPayers();
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] });
    const hold = await holdFor(merchant.secretKey, small);
    // Plenty of money: only the overrun rule can refuse.
    await creditWallet(t.storage, merchant.walletId, hold * 1000n);

    let answerSlow!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answerSlow = resolve)) });
    upstream.setNext({ path: '/chat/completions', overReport: 40 });
    const slow = post(merchant.secretKey, small);
    try {
      // A request in flight (its hold written), then one the provider bills 40 times over.
      await until(async () => (await wallet(merchant.walletId)).held > 0n);
      const overrun = await post(merchant.secretKey, small);
      const rec = await t.settledRecord(overrun.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
      expect(parseMoney(rec.total_merchant_cost)).toBeGreaterThan(hold);

      // The slow one may overrun too: nothing more is admitted while it is in flight.
      await expectRefusedUntilSettled(merchant, small, slow, answerSlow);
    } finally {
      answerSlow();
      await slow.catch(() => undefined);
    }
  });

  it('a document named by reference is held at MEDIA_REFERENCE_HOLD_TOKENS, an allowance: one that counts for more is charged in full and overruns its wallet (decision 0019)', async () => {
    const { merchant } = await freshPayers();
    const text = { type: 'text', text: 'summarise the contract' };
    const byReference = JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: [text, { type: 'file', file: { file_id: 'file-contract' } }] }] });
    const hold = await holdFor(merchant.secretKey, byReference);
    // The document counts the allowance, 10,000 input tokens at gpt-4o's 2.5 per million, on top of the text.
    const textOnly = await holdFor(merchant.secretKey, JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: [text] }] }));
    expect(hold - textOnly).toBeGreaterThanOrEqual(parseMoney('0.025'));
    await creditWallet(t.storage, merchant.walletId, hold * 1000n);

    let answerSlow!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answerSlow = resolve)) });
    // The document was 50,000 tokens long: five times the allowance.
    upstream.setNext({ path: '/chat/completions', inputTokens: 50_000 });
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] });
    const slow = post(merchant.secretKey, small);
    try {
      await until(async () => (await wallet(merchant.walletId)).held > 0n);
      const long = await post(merchant.secretKey, byReference);
      expect(long.status).toBe(200);
      const rec = await t.settledRecord(long.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
      // Charged what the provider counted, not the allowance.
      expect(rec.model_usage.input_tokens).toBe(50_000);
      expect(parseMoney(rec.total_merchant_cost)).toBeGreaterThan(hold);
      expect(Number((await wallet(merchant.walletId)).overrun)).toBe(1);

      // Nothing more is admitted on the wallet while another request is in flight on it.
      await expectRefusedUntilSettled(merchant, small, slow, answerSlow);
    } finally {
      answerSlow();
      await slow.catch(() => undefined);
    }
  });

  it('a request still relaying when its TTL passes keeps its hold alive and is charged when it ends', async () => {
    const { merchant } = await freshPayers();
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
    const before = await wallet(merchant.walletId);

    // The provider answers when the test says; the hold's TTL is 1 s (HOLD_TTL_MS).
    let answer!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answer = resolve)) });
    const inFlight = post(merchant.secretKey, body).then(async (res) => ({ res, text: await res.text() }));
    try {
      let pending: { id: string; created_at: string } | undefined;
      for (let i = 0; i < 100 && !pending; i++) {
        pending = await t.storage.db
          .selectFrom('requests')
          .select(['id', 'created_at'])
          .where('merchant_id', '=', merchant.merchantId)
          .where('status', '=', 'pending')
          .executeTakeFirst();
        if (!pending) await sleep(10);
      }
      expect(pending).toBeDefined();

      // Well past the TTL the hold admission placed, the sweeper finds nothing: the hold keeper
      // (every third of a TTL) pushed it a full TTL past the clock's new time.
      t.clock.advance(1600);
      const renewedPast = Date.parse(pending!.created_at) + 1600;
      const holdRow = () => t.storage.db.selectFrom('holds').selectAll().where('reference', '=', pending!.id).executeTakeFirstOrThrow();
      let hold = await holdRow();
      for (let i = 0; i < 100 && Date.parse(hold.expires_at) <= renewedPast; i++) {
        await sleep(10);
        hold = await holdRow();
      }
      expect(await sweepExpiredHolds(t.storage, dateOf(t.clock))).toBe(0);
      expect(hold.status).toBe('active');
      expect(Date.parse(hold.expires_at)).toBeGreaterThan(renewedPast);
      expect((await record(pending!.id, merchant)).status).toBe('pending');
      answer();

      const { res } = await inFlight;
      expect(res.status).toBe(200);
      const rec = await t.settledRecord(pending!.id, t.auth(merchant.secretKey));
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
    const { merchant } = await freshPayers();
    await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
    const before = await wallet(merchant.walletId);

    // The provider answers when the test says; the hold's TTL is 1 s (HOLD_TTL_MS).
    let answer!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answer = resolve)) });
    const inFlight = post(merchant.secretKey, body).then(async (res) => ({ res, text: await res.text() }));
    try {
      let pending: { id: string } | undefined;
      for (let i = 0; i < 100 && !pending; i++) {
        pending = await t.storage.db
          .selectFrom('requests')
          .select('id')
          .where('merchant_id', '=', merchant.merchantId)
          .where('status', '=', 'pending')
          .executeTakeFirst();
        if (!pending) await sleep(10);
      }
      expect(pending).toBeDefined();
      const holds = await t.storage.db.selectFrom('holds').selectAll().where('reference', '=', pending!.id).execute();
      expect(holds.length).toBe(1);
      expect(holds[0]!.status).toBe('active');
      expect((await wallet(merchant.walletId)).held).toBe(BigInt(holds[0]!.amount));

      // Not yet expired: nothing to sweep.
      expect(await sweepExpiredHolds(t.storage, new Date())).toBe(0);
      // As if the sweeper ran a whole TTL after the last renewal.
      expect(await sweepExpiredHolds(t.storage, new Date(Date.now() + 60_000))).toBe(1);
      expect((await t.storage.db.selectFrom('holds').select('status').where('id', '=', holds[0]!.id).executeTakeFirstOrThrow()).status).toBe(
        'expired',
      );
      // The provider may have answered: never free. It is charged what its hold was placed for.
      const recovered = await record(pending!.id, merchant);
      expect(recovered.status).toBe('completed');
      expect(recovered.usage_estimated).toBe(true);
      const holdAmount = BigInt(holds[0]!.amount);
      expect(parseMoney(recovered.total_merchant_cost) + parseMoney(recovered.total_wallet_cost)).toBe(holdAmount);
      const swept = await wallet(merchant.walletId);
      expect(swept.held).toBe(0n);
      expect(swept.balance).toBe(before.balance - holdAmount);
      // A second sweep finds nothing.
      expect(await sweepExpiredHolds(t.storage, new Date(Date.now() + 60_000))).toBe(0);

      // The provider answers after all: the client gets its answer; the record keeps its one charge.
      answer();
      const { res } = await inFlight;
      expect(res.status).toBe(200);
      expect(res.headers.get('x-tollgate-request-id')).toBe(pending!.id);
      await t.app.gateway.settlements.drain();
      const rec = await record(pending!.id, merchant);
      expect(rec.status).toBe('completed');
      expect(rec.usage_estimated).toBe(true);
      const charges = await t.storage.db.selectFrom('ledger_transactions').select('id').where('reference', '=', pending!.id).execute();
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

  describe('settlement is idempotent', () => {
    async function settleInput(credential: string, recordId: string, holdIds: string[]): Promise<SettleInput> {
      const billing = await resolveForwardCredential(t.storage, credential, new Date());
      return {
        recordId,
        holdIds,
        billing,
        usage: { inputTokens: 100, outputTokens: 50, inputCharacters: 0, outputCharacters: 0, inputSeconds: '0', outputSeconds: '0' },
        model: 'gpt-4o',
        prices: lookupBasePrices('openai', 'gpt-4o', { overrides: t.config.priceOverrides }),
        baseCostCharged: true,
        serviceChargeRate: t.config.serviceChargeRate,
        responseId: 'chatcmpl-replayed',
        usageEstimated: false,
      };
    }
    const transactionsFor = async (reference: string) =>
      (await t.storage.db.selectFrom('ledger_transactions').select('id').where('reference', '=', reference).execute()).length;

    it('settling a forwarded request again charges nothing more', async () => {
      const { merchant, token, customerWalletId } = await freshPayers();
      await creditWallet(t.storage, customerWalletId, parseMoney('5'));
      const res = await post(token, body);
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const recordId = res.headers.get('x-tollgate-request-id')!;
      const first = await t.settledRecord(recordId, t.auth(merchant.secretKey));
      expect(first.status).toBe('completed');
      const balance = (await wallet(customerWalletId)).balance;
      const holdIds = (await t.storage.db.selectFrom('holds').select('id').where('reference', '=', recordId).execute()).map((h) => h.id);
      // The embedded shape writes no hold row when the settlement takes its admission over (0011).
      expect(holdIds.length).toBeLessThanOrEqual(1);
      const transactions = await transactionsFor(recordId);
      expect(transactions).toBe(1);

      expect((await settleRequest(t.storage, await settleInput(token, recordId, holdIds))).outcome).toBe('duplicate');
      await failRequest(t.storage, { recordId, holdIds });
      expect((await wallet(customerWalletId)).balance).toBe(balance);
      expect((await wallet(customerWalletId)).held).toBe(0n);
      expect(await transactionsFor(recordId)).toBe(1);
      const again = await record(recordId, merchant);
      expect(again).toMatchObject({ status: 'completed', total_request_cost: first.total_request_cost, model_usage: first.model_usage });
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });

    it('two concurrent settlements of one admitted request charge once', async () => {
      const { merchant } = await freshPayers();
      await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
      const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
      const { walletId } = pricingFor(billing);
      const recordId = newId('request');
      const admitted = await admitRequest(t.storage, {
        requestId: recordId,
        billing,
        walletId,
        estimate: { wallet: parseMoney('0.01'), merchant: 0n },
        ttlMs: 60_000,
        record: { provider: 'openai', model: 'gpt-4o', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed', metadata: {} },
      });
      expect(admitted.outcome).toBe('admitted');
      if (admitted.outcome !== 'admitted') return;
      const before = (await wallet(merchant.walletId)).balance;
      const input = await settleInput(merchant.secretKey, admitted.recordId, admitted.holdIds);
      const outcomes = await Promise.all([settleRequest(t.storage, input), settleRequest(t.storage, input), settleRequest(t.storage, input)]);
      const recorded = outcomes.filter((o) => o.outcome === 'recorded');
      expect(recorded.length).toBe(1);
      expect(outcomes.filter((o) => o.outcome === 'duplicate').length).toBe(2);
      const charged = recorded[0]!.outcome === 'recorded' ? recorded[0]!.row.total_merchant_cost + recorded[0]!.row.total_wallet_cost : 0n;
      expect(charged).toBeGreaterThan(0n);
      const after = await wallet(merchant.walletId);
      expect(after.balance).toBe(before - charged);
      expect(after.held).toBe(0n);
      expect(await transactionsFor(admitted.recordId)).toBe(1);
      expect((await record(admitted.recordId, merchant)).status).toBe('completed');
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });

    it('a failed request stays failed: a late settlement and a second failure change nothing', async () => {
      const { merchant } = await freshPayers();
      await creditWallet(t.storage, merchant.walletId, parseMoney('5'));
      upstream.setNext({ path: '/chat/completions', status: 500 });
      const res = await post(merchant.secretKey, body);
      expect(res.status).toBe(500);
      await res.arrayBuffer();
      const recordId = res.headers.get('x-tollgate-request-id')!;
      expect((await t.settledRecord(recordId, t.auth(merchant.secretKey))).status).toBe('error');
      const before = await wallet(merchant.walletId);
      const holdIds = (await t.storage.db.selectFrom('holds').select('id').where('reference', '=', recordId).execute()).map((h) => h.id);
      expect((await settleRequest(t.storage, await settleInput(merchant.secretKey, recordId, holdIds))).outcome).toBe('duplicate');
      await failRequest(t.storage, { recordId, holdIds });
      const after = await wallet(merchant.walletId);
      expect(after.balance).toBe(before.balance);
      expect(after.held).toBe(0n);
      expect((await record(recordId, merchant)).status).toBe('error');
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });
  });
});
