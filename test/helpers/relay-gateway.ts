import { afterAll, beforeAll } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, startTestApp, type CustomerWithMeter, type TestApp } from './app.ts';
import type { TestDatabase } from './databases.ts';
import { live } from './live.ts';
import { startMockUpstream, type MockUpstream } from './mock-upstream.ts';
import { closedPort, startRawProvider, startSilentServer, type RawProvider, type SilentServer } from './raw-provider.ts';

/**
 * The forward gateway of the relay tests, over real HTTP: OpenAI and Anthropic on the shared
 * mock, Mistral on the raw provider (raw-provider.ts), Groq on a TLS port that never answers the
 * handshake. A customer on a meter of 100 per 1M tokens pays with `customerToken`; the merchant's
 * and the customer's wallets hold 10 each.
 *
 * With `shortTimeouts`, a second gateway (`tt`, at `timeoutBase`) on the same providers gives up
 * on the provider after 300 ms (UPSTREAM_TIMEOUT_MS, UPSTREAM_IDLE_TIMEOUT_MS) and maps xAI to a
 * port that refuses connections; its merchant's wallet holds 10.
 */

/** The error envelope of Tollgate's own refusals. */
export type Envelope = { error: { code: string; status: number } };

/** /v1/forward's query naming Mistral's chat completions (the raw provider). */
export const MISTRAL_CHAT = `u=${encodeURIComponent('https://api.mistral.ai/v1/chat/completions')}`;

export type RelayGateway = ReturnType<typeof useRelayGateway>;

/** Registers the block's gateway(s) and providers (beforeAll/afterAll). */
export function useRelayGateway(dialect: TestDatabase['dialect'], opts: { shortTimeouts?: boolean } = {}) {
  let upstream: MockUpstream;
  let raw: RawProvider;
  let silent: SilentServer;
  let t: TestApp;
  let base: string;
  let customer: CustomerWithMeter;
  let customerToken: string;
  // A second gateway with short upstream timeouts.
  let tt: TestApp | undefined;
  let timeoutBase: string | undefined;

  beforeAll(async () => {
    upstream = await startMockUpstream();
    raw = await startRawProvider();
    silent = await startSilentServer();
    const overrides = {
      'api.openai.com': upstream.url,
      'api.anthropic.com': upstream.url,
      'api.mistral.ai': raw.url,
      'api.groq.com': `https://127.0.0.1:${silent.port}`,
    };
    const keys = { openai: 'sk-managed-openai', anthropic: 'sk-managed-anthropic', mistral: 'managed-mistral', xai: 'managed-xai', groq: 'managed-groq' };
    t = await startTestApp(dialect, { env: { UPSTREAM_OVERRIDES: JSON.stringify(overrides), PROVIDER_KEYS: JSON.stringify(keys) } });
    base = await t.listen();
    customer = await t.customerWithMeter({ credit: '10', meter: { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '100' }] } });
    customerToken = forwardToken(t.merchant.secretKey, customer.customerId, customer.meterSlug);
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
    if (!opts.shortTimeouts) return;

    tt = await startTestApp(dialect, {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify({ ...overrides, 'api.x.ai': `http://127.0.0.1:${await closedPort()}` }),
        PROVIDER_KEYS: JSON.stringify(keys),
        UPSTREAM_TIMEOUT_MS: '300',
        UPSTREAM_IDLE_TIMEOUT_MS: '300',
      },
    });
    timeoutBase = await tt.listen();
    await creditWallet(tt.storage, tt.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await tt?.close();
    await t?.close();
    await upstream?.close();
    await raw?.close();
    await silent?.close();
  });

  const wallet = async (id: string, app: TestApp = t) => (await findWallet(app.storage, id))!;
  const merchantAuth = () => ({ authorization: `Bearer ${t.merchant.secretKey}` });

  /** POSTs `body` to /v1/forward?`query` on `root` (the first gateway unless named), as the merchant unless `headers` say otherwise. */
  function post(query: string, body: string | Buffer, headers: Record<string, string> = {}, root = base, signal?: AbortSignal): Promise<Response> {
    return fetch(`${root}/v1/forward?${query}`, {
      method: 'POST',
      headers: { ...merchantAuth(), 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : Uint8Array.from(body),
      ...(signal ? { signal } : {}),
    });
  }

  const needsShortTimeouts = (what: string) => {
    throw new Error(`${what} is started only with useRelayGateway(dialect, { shortTimeouts: true })`);
  };

  return {
    upstream: live('the mock provider', () => upstream),
    raw: live('the raw provider', () => raw),
    silent: live('the silent server', () => silent),
    t: live('the test app', () => t),
    customer: live('the customer', () => customer),
    tt: live('the short-timeout test app', () => (opts.shortTimeouts ? tt : needsShortTimeouts('the short-timeout gateway'))),
    /** The first gateway's base URL, e.g. http://127.0.0.1:PORT */
    get base() {
      return base;
    },
    /** A forward token: the customer pays base cost + the meter's fee. */
    get customerToken() {
      return customerToken;
    },
    /** The short-timeout gateway's base URL. */
    get timeoutBase(): string {
      return opts.shortTimeouts ? timeoutBase! : needsShortTimeouts('the short-timeout gateway');
    },
    wallet,
    post,
  };
}
