import { afterAll, afterEach, beforeAll } from 'vitest';
import { findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type Merchant, type TestApp } from './app.ts';
import type { TestDatabase } from './databases.ts';
import { OPENAI_CHAT, startGatewayOnMock } from './gateway.ts';
import { live } from './live.ts';
import type { MockUpstream } from './mock-upstream.ts';

/**
 * The forward gateway of the admission and hold tests: OpenAI on the mock with a
 * managed key, holds that expire after 1 s (HOLD_TTL_MS) unless renewed, and per test fresh payers
 * whose wallets hold only what the test credits.
 */

/** A gpt-4o chat completion capped at 2000 output tokens, so its hold is far above its cost. */
export const CHAT_BODY = JSON.stringify({ model: 'gpt-4o', max_tokens: 2000, messages: [{ role: 'user', content: 'one two three four five six seven eight' }] });

export type AdmissionGateway = ReturnType<typeof useAdmissionGateway>;

/** Registers the block's gateway (beforeAll/afterAll); the mock forgets its requests after each test. */
export function useAdmissionGateway(dialect: TestDatabase['dialect']) {
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

  function post(credential: string, body: string): Promise<Response> {
    return fetch(`${base}/v1/forward?${OPENAI_CHAT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json' },
      body,
    });
  }

  /** A fresh merchant with a customer on a meter with a fee: both payer shapes are available. */
  async function freshPayers() {
    const merchant = await t.newMerchant('Race');
    const customer = await t.customerWithMeter({
      secretKey: merchant.secretKey,
      meter: { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '50' }] },
    });
    return { merchant, customerWalletId: customer.walletId, token: forwardToken(merchant.secretKey, customer.customerId, customer.meterSlug) };
  }

  return {
    upstream: live('the mock provider', () => upstream),
    t: live('the test app', () => t),
    /** The gateway's base URL, e.g. http://127.0.0.1:PORT */
    get base() {
      return base;
    },
    /** A request's record as `merchant` sees it through GET /v1/requests/{id}, pending or not. */
    record,
    wallet,
    /** POSTs `body` to OpenAI's chat completions through /v1/forward, paid with `credential`. */
    post,
    freshPayers,
  };
}
