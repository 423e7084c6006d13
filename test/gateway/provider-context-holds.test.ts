import { GoogleGenAI } from '@google/genai';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { DEFAULT_CONTEXT_HOLD_TOKENS } from '../../src/providers/estimate.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Provider-side context (decision 0025): a Responses API call naming `previous_response_id`, or a
 * Gemini call naming `cachedContent`, is billed for context its body does not carry. The hold
 * counts the size the gateway learned from the usage of the call that made it (or used it), and
 * a context it never saw at PROVIDER_CONTEXT_HOLD_TOKENS; and a wallet whose calls still cost more
 * than their holds keeps being served while it can pay for what its calls in flight may overrun.
 * Driven by the official openai and @google/genai clients over real HTTP to the local mock
 * provider; calls are kept in flight by the mock (each answers when the test releases it), so
 * nothing waits on time.
 */

/** The wallet: $90.74, with 20 calls, 8 of them in flight at once. */
const WALLET = parseMoney('90.74');
const CALLS = 20;
const IN_FLIGHT = 8;

describe.each(databasesUnderTest())('holds for provider-side context, through the official SDKs, on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com', 'generativelanguage.googleapis.com'],
      providerKeys: { openai: 'sk-openai-managed', google: 'AIza-google-managed' },
    }));
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  /** A merchant of its own, its wallet funded with WALLET, paying with its secret key. */
  async function fundedMerchant(name: string) {
    const merchant = await t.newMerchant(name);
    await creditWallet(t.storage, merchant.walletId, WALLET, new Date().toISOString());
    const openai = new OpenAI({ apiKey: merchant.secretKey, baseURL: `${base}/v1/forward?u=https://api.openai.com/v1`, maxRetries: 0 });
    const genai = new GoogleGenAI({ apiKey: merchant.secretKey, httpOptions: { baseUrl: `${base}/v1/forward?u=https://generativelanguage.googleapis.com` } });
    return { merchant, openai, genai };
  }

  const record = (id: string) =>
    t.storage.db.selectFrom('requests').select(['status', 'input_tokens', 'total_merchant_cost']).where('id', '=', id).executeTakeFirst();
  /** The settled record of a call the gateway answered with `requestId`: the input tokens the provider counted, and the charge. */
  async function settled(requestId: string) {
    await until(async () => (await record(requestId))?.status === 'completed', `${requestId} is settled`);
    const row = (await record(requestId))!;
    return { counted: Number(row.input_tokens), cost: BigInt(row.total_merchant_cost) };
  }
  const walletOf = (walletId: string) => t.storage.db.selectFrom('wallets').select(['balance', 'held', 'overrun']).where('id', '=', walletId).executeTakeFirstOrThrow();
  const overrunOf = async (walletId: string) => Number((await walletOf(walletId)).overrun);

  /**
   * One call alone on its wallet, answered by the mock with `inputTokens` once the test has seen
   * its hold on the wallet: what was held for it and what it was charged.
   */
  async function heldAndCharged(walletId: string, path: string, inputTokens: number, call: () => Promise<{ status: number; requestId: string | null }>) {
    let release!: () => void;
    upstream.setNext({ path, inputTokens, outputTokens: 8, releasedBy: new Promise<void>((resolve) => (release = resolve)) });
    const pending = call();
    try {
      // On SQLite the hold reaches the row shortly after admission (decision 0011).
      await until(async () => BigInt((await walletOf(walletId)).held) > 0n, 'the call is held');
      const held = BigInt((await walletOf(walletId)).held);
      release();
      const { status, requestId } = await pending;
      expect(status).toBe(200);
      return { held, ...(await settled(requestId!)) };
    } finally {
      release();
    }
  }

  /**
   * CALLS calls made by `call(i)` (each answered by the mock with `behaviour` once released), IN_FLIGHT of them
   * in flight at once: call i is released, and settled, once call i + IN_FLIGHT has reached the
   * provider. Returns each call's status and request id.
   */
  async function overlapping(path: string, inputTokens: number, call: (i: number) => Promise<{ status: number; requestId: string | null }>) {
    const releases: (() => void)[] = [];
    const results: Promise<{ status: number; requestId: string | null }>[] = [];
    const answered = async (i: number) => {
      releases[i]!();
      const result = await results[i]!;
      if (result.requestId) await settled(result.requestId);
    };
    for (let i = 0; i < CALLS; i++) {
      upstream.setNext({ path, inputTokens, outputTokens: 8, releasedBy: new Promise<void>((resolve) => releases.push(resolve)) });
      const reached = upstream.requests.length;
      results.push(call(i));
      // Reached the provider, or refused before it.
      await until(async () => upstream.requests.length > reached || (await Promise.race([results[i]!.then(() => true), Promise.resolve(false)])), `call ${i} is under way`);
      if (i >= IN_FLIGHT) await answered(i - IN_FLIGHT);
    }
    for (let i = Math.max(0, CALLS - IN_FLIGHT); i < CALLS; i++) await answered(i);
    return Promise.all(results);
  }

  /** A call through an SDK: its status (402 when refused) and the gateway's request id. */
  async function outcome(run: () => Promise<{ response: Response }>): Promise<{ status: number; requestId: string | null }> {
    try {
      const { response } = await run();
      return { status: response.status, requestId: response.headers.get('x-tollgate-request-id') };
    } catch (error) {
      const status = (error as { status?: number }).status;
      if (typeof status === 'number') return { status, requestId: null };
      throw error;
    }
  }

  it('responses.create with previous_response_id holds the conversation the first answer started, learned from its usage: no call costs more than its hold', async () => {
    const { merchant, openai } = await fundedMerchant('Conversation');
    // The first call reads a long document: its body bounds what the provider counts.
    upstream.setNext({ path: '/responses', inputTokens: 9_000, outputTokens: 900 });
    const first = await openai.responses.create({ model: 'gpt-4o', input: 'word '.repeat(9_000), max_output_tokens: 1_000 }).withResponse();
    expect((await settled(first.response.headers.get('x-tollgate-request-id')!)).counted).toBe(9_000);
    expect(first.data.id).toMatch(/^resp_/);

    // Every follow-up carries the 9,900 tokens of conversation the provider kept, in a tiny body.
    const followUp = () =>
      outcome(() => openai.responses.create({ model: 'gpt-4o', previous_response_id: first.data.id, input: 'and then?', max_output_tokens: 16 }).withResponse());
    const alone = await heldAndCharged(merchant.walletId, '/responses', 9_910, followUp);
    // Held for the learned 9,900 tokens besides the body: it covers the charge, and not by the
    // allowance for an unknown context (32,000 tokens, over three times the charge).
    expect(alone.counted).toBe(9_910);
    expect(alone.cost).toBeLessThanOrEqual(alone.held);
    expect(alone.held).toBeLessThan(alone.cost * 2n);

    const results = await overlapping('/responses', 9_910, followUp);
    expect(results.map((r) => r.status)).toEqual(Array(CALLS).fill(200));
    // No call cost more than its hold.
    expect(await overrunOf(merchant.walletId)).toBe(0);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('a previous response this gateway never saw is held at PROVIDER_CONTEXT_HOLD_TOKENS', async () => {
    const { merchant, openai } = await fundedMerchant('Allowance');
    const unknown = () =>
      outcome(() => openai.responses.create({ model: 'gpt-4o', previous_response_id: 'resp_never_seen', input: 'and then?', max_output_tokens: 16 }).withResponse());
    // Reported at exactly the allowance (plus the few tokens of the body): the hold covers it.
    const atAllowance = await heldAndCharged(merchant.walletId, '/responses', DEFAULT_CONTEXT_HOLD_TOKENS, unknown);
    expect(atAllowance.cost).toBeLessThanOrEqual(atAllowance.held);
    expect(await overrunOf(merchant.walletId)).toBe(0);
  });

  it('a previous response larger than the allowance overruns its holds, and the funded wallet is never refused while calls are in flight (the issue: 8 of 20 refused)', async () => {
    const { merchant, openai } = await fundedMerchant('Unknown conversation');
    // Made directly with the provider: no usage seen here. It holds 100,000 tokens.
    const results = await overlapping('/responses', 100_000, () =>
      outcome(() => openai.responses.create({ model: 'gpt-4o', previous_response_id: 'resp_made_elsewhere', input: 'and then?', max_output_tokens: 16 }).withResponse()),
    );
    expect(results.filter((r) => r.status !== 200)).toEqual([]);
    expect((await settled(results[0]!.requestId!)).counted).toBe(100_000);
    // The calls overran their holds (the allowance was short): the wallet is overrun, and was served throughout.
    expect(await overrunOf(merchant.walletId)).toBeGreaterThan(0);
    const wallet = await walletOf(merchant.walletId);
    expect(BigInt(wallet.held)).toBe(0n);
    expect(BigInt(wallet.balance)).toBeGreaterThan(0n);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  it('generateContent with cachedContent: the first call holds the allowance and overruns, later ones hold the cache size learned from its usage; none refused', async () => {
    const { merchant, genai } = await fundedMerchant('Cached content');
    const ask = () =>
      outcome(() =>
        genai.models
          .generateContent({ model: 'gemini-2.5-flash', contents: 'summarise the cached report', config: { cachedContent: 'cachedContents/report-1', maxOutputTokens: 16 } })
          .then((answer) => ({ response: new Response(null, { status: 200, headers: answer.sdkHttpResponse?.headers ?? {} }) })),
      );
    // The cache holds 50,000 tokens, more than the allowance: the first call costs more than its hold.
    const first = await heldAndCharged(merchant.walletId, ':generateContent', 50_000, ask);
    expect(upstream.requests.at(-1)!.json).toMatchObject({ cachedContent: 'cachedContents/report-1' });
    expect(first.counted).toBe(50_000);
    expect(first.cost).toBeGreaterThan(first.held);
    // Its usage told the cache's size: the next call holds it.
    const second = await heldAndCharged(merchant.walletId, ':generateContent', 50_000, ask);
    expect(second.cost).toBeLessThanOrEqual(second.held);
    expect(second.held).toBeLessThan(second.cost * 2n);

    const results = await overlapping(':generateContent', 50_000, ask);
    expect(results.map((r) => r.status)).toEqual(Array(CALLS).fill(200));
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
