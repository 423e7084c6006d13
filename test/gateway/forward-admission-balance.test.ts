import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { CHAT_BODY as body, useAdmissionGateway } from '../helpers/admission-gateway.ts';
import type { Merchant } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';
import { OPENAI_CHAT } from '../helpers/gateway.ts';

/**
 * Admission over real HTTP: a request is admitted only when the paying wallet's
 * available balance (balance − active holds) covers its hold estimate, checked atomically under
 * concurrency, and refused with 402 before any provider call otherwise.
 *
 * The hold estimate is computed here with the gateway's own functions (estimateHold with the
 * request's max_tokens as output cap, the model's base prices, the payer's pricing), so the
 * wallets can be funded for exactly N requests.
 *
 * The bound on a negative balance: an admitted request is charged its actual cost even when that
 * exceeds its hold, so a wallet can end below zero, but only by (actual − hold) of the requests
 * admitted against it; the mock counts one input token per word while the estimate counts one per
 * four characters, which lets a test make actual > hold on purpose. A wallet whose charge
 * overran its hold admits nothing more while it has requests in flight (decision 0019).
 */

type Envelope = { error: { code: string } };

describe.each(databasesUnderTest())('forward gateway admission and holds on %s', (dialect) => {
  const h = useAdmissionGateway(dialect);
  const { t, upstream, wallet, post, freshPayers } = h;

  const noActiveHolds = async (walletId: string) =>
    (await t.storage.db.selectFrom('holds').select('id').where('wallet_id', '=', walletId).where('status', '=', 'active').execute()).length === 0;


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
      await creditWallet(t.storage, walletId, funded, new Date().toISOString());

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
      // A balance goes below zero only by what admitted requests cost beyond their holds.
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
        const res = await fetch(`${h.base}/v1/forward?${OPENAI_CHAT}`, {
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
    await creditWallet(t.storage, merchant.walletId, smallHold * 2n, new Date().toISOString());
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
    await creditWallet(t.storage, merchant.walletId, hold, new Date().toISOString());

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

    await creditWallet(t.storage, merchant.walletId, actual - hold + (await holdFor(merchant.secretKey, small)) * 2n, new Date().toISOString());
    const ok = await post(merchant.secretKey, small);
    expect(ok.status).toBe(200);
    await ok.arrayBuffer();
    await t.settledRecord(ok.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  /**
   * An overrun wallet that can pay for what its requests in flight may overrun admits `payload`
   * while `slow` is in flight (decision 0025); once `slow` is answered and settled, nothing is in
   * flight and the admission that follows ends the overrun.
   */
  async function expectAdmittedWhileFunded(merchant: Merchant, payload: string, slow: Promise<Response>, answerSlow: () => void) {
    expect(Number((await wallet(merchant.walletId)).overrun)).toBeGreaterThan(0);
    const during = await post(merchant.secretKey, payload);
    expect(during.status).toBe(200);
    await t.settledRecord(during.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));

    answerSlow();
    const answered = await slow;
    await t.settledRecord(answered.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    const ok = await post(merchant.secretKey, payload);
    expect(ok.status).toBe(200);
    await t.settledRecord(ok.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect(Number((await wallet(merchant.walletId)).overrun)).toBe(0);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  }

  /** Starts `slow` (held until answered), then a request the provider bills 40 times over, settled. */
  async function overrunWithOneInFlight(merchant: Merchant, small: string, hold: bigint) {
    let answerSlow!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answerSlow = resolve)) });
    upstream.setNext({ path: '/chat/completions', overReport: 40 });
    const slow = post(merchant.secretKey, small);
    await until(async () => (await wallet(merchant.walletId)).held > 0n, 'a hold on the wallet');
    const overrun = await post(merchant.secretKey, small);
    const rec = await t.settledRecord(overrun.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    expect(parseMoney(rec.total_merchant_cost)).toBeGreaterThan(hold);
    return { slow, answerSlow };
  }

  it('a wallet whose settled charge exceeded its hold still admits while it can pay what its requests in flight may overrun: no 402 for a funded wallet (decision 0025)', async () => {
    const { merchant } = await freshPayers();
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] });
    const hold = await holdFor(merchant.secretKey, small);
    await creditWallet(t.storage, merchant.walletId, hold * 1000n, new Date().toISOString());
    const { slow, answerSlow } = await overrunWithOneInFlight(merchant, small, hold);
    try {
      await expectAdmittedWhileFunded(merchant, small, slow, answerSlow);
    } finally {
      answerSlow();
      await slow.catch(() => undefined);
    }
  });

  it('an overrun wallet is refused, without calling the provider, exactly when its available balance less what its requests in flight and the new one may overrun cannot cover the new hold (decision 0025)', async () => {
    const { merchant } = await freshPayers();
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] });
    const hold = await holdFor(merchant.secretKey, small);
    // Enough for the two holds; the overrun then takes the wallet below what the rule lets admit.
    await creditWallet(t.storage, merchant.walletId, hold * 2n, new Date().toISOString());
    const { slow, answerSlow } = await overrunWithOneInFlight(merchant, small, hold);
    try {
      const after = await wallet(merchant.walletId);
      const perThousand = BigInt(after.overrun!);
      expect(perThousand).toBeGreaterThan(1_000n);
      // What the one in flight and the new one may cost beyond their holds at the last overrun's rate.
      const allowance = ((after.held + hold) * perThousand + 999n) / 1_000n;
      const available = after.balance - after.held;
      // Short by one unit of what an admission needs: refused.
      await creditWallet(t.storage, merchant.walletId, allowance + hold - 1n - available, new Date().toISOString());
      const before = upstream.requests.length;
      const refused = await post(merchant.secretKey, small);
      expect(refused.status).toBe(402);
      expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('insufficient_balance');
      expect(upstream.requests.length).toBe(before);
      // One unit more: admitted.
      await creditWallet(t.storage, merchant.walletId, 1n, new Date().toISOString());
      const admitted = await post(merchant.secretKey, small);
      expect(admitted.status).toBe(200);
      await t.settledRecord(admitted.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
    } finally {
      answerSlow();
      await slow.catch(() => undefined);
    }
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a document named by reference is held at MEDIA_REFERENCE_HOLD_TOKENS, an allowance: one that counts for more is charged in full and overruns its wallet (decisions 0019, 0025)', async () => {
    const { merchant } = await freshPayers();
    const text = { type: 'text', text: 'summarise the contract' };
    const byReference = JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: [text, { type: 'file', file: { file_id: 'file-contract' } }] }] });
    const hold = await holdFor(merchant.secretKey, byReference);
    // The document counts the allowance, 10,000 input tokens at gpt-4o's 2.5 per million, on top of the text.
    const textOnly = await holdFor(merchant.secretKey, JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: [text] }] }));
    expect(hold - textOnly).toBeGreaterThanOrEqual(parseMoney('0.025'));
    await creditWallet(t.storage, merchant.walletId, hold * 1000n, new Date().toISOString());

    let answerSlow!: () => void;
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (answerSlow = resolve)) });
    // The document was 50,000 tokens long: five times the allowance.
    upstream.setNext({ path: '/chat/completions', inputTokens: 50_000 });
    const small = JSON.stringify({ model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] });
    const slow = post(merchant.secretKey, small);
    try {
      await until(async () => (await wallet(merchant.walletId)).held > 0n, 'a hold on the wallet');
      const long = await post(merchant.secretKey, byReference);
      expect(long.status).toBe(200);
      const rec = await t.settledRecord(long.headers.get('x-tollgate-request-id')!, t.auth(merchant.secretKey));
      // Charged what the provider counted, not the allowance.
      expect(rec.model_usage.input_tokens).toBe(50_000);
      expect(parseMoney(rec.total_merchant_cost)).toBeGreaterThan(hold);
      expect(Number((await wallet(merchant.walletId)).overrun)).toBeGreaterThan(1_000);

      // The wallet can pay what the one in flight may overrun: it still admits.
      await expectAdmittedWhileFunded(merchant, small, slow, answerSlow);
    } finally {
      answerSlow();
      await slow.catch(() => undefined);
    }
  });
});
