import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { CredentialCache } from '../../src/gateway/credential-cache.ts';
import { resolveCredential } from '../../src/gateway/credentials.ts';
import type { BillingContext } from '../../src/ledger/billing.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * The gateway caches resolved credentials; a revocation, deletion or pause made through this
 * instance must take effect on the very next request, and so must a change of whether the
 * customer's plan credit pays for the meter (decision 0016).
 */

type Json = Record<string, unknown>;
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64');
const chatBody = JSON.stringify({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'hello there' }] });

const fakeContext = { merchantId: 'mer_x' } as BillingContext;

describe('CredentialCache', () => {
  it('serves a stored resolution without loading again', async () => {
    const cache = new CredentialCache();
    let loads = 0;
    const load = async () => {
      loads++;
      return fakeContext;
    };
    await cache.resolve('a', load);
    await cache.resolve('a', load);
    expect(loads).toBe(1);
  });

  it('does not store a resolution that was in flight when a change happened', async () => {
    const cache = new CredentialCache();
    let release!: () => void;
    const pending = cache.resolve('a', () => new Promise<BillingContext>((r) => (release = () => r(fakeContext))));
    cache.invalidate();
    release();
    await pending;
    expect(cache.size).toBe(0);
  });

  it('does not store failed resolutions', async () => {
    const cache = new CredentialCache();
    await expect(cache.resolve('bad', async () => Promise.reject(new Error('unknown key')))).rejects.toThrow('unknown key');
    expect(cache.size).toBe(0);
  });
});

describe.each(databasesUnderTest())('credential cache invalidation on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com'],
      providerKeys: { openai: 'sk-managed' },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('50'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const forward = (credential: string) =>
    fetch(`${base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json' },
      body: chatBody,
    });
  const api = async (method: 'POST' | 'DELETE' | 'PATCH', url: string, payload?: Json) => {
    const res = await t.app.inject({ method, url, headers: t.auth(), ...(payload ? { payload } : {}) });
    expect(res.statusCode, res.body).toBeLessThan(300);
    return res.json() as Json;
  };
  /** Twice: the second answer would come from the cache. */
  async function usable(credential: string) {
    for (let i = 0; i < 2; i++) {
      const res = await forward(credential);
      expect(res.status).toBe(200);
      await res.text();
    }
  }
  /** Usable, and held in the cache (after the quiet period that follows any earlier change). */
  async function cached(credential: string) {
    t.clock.advance(1100);
    await usable(credential);
    expect(t.app.gateway.credentials.size).toBeGreaterThan(0);
  }
  const codeOf = async (res: Response) => ((await res.json()) as { error: { code: string } }).error.code;

  it('a revoked secret key is refused on the next request', async () => {
    const key = await api('POST', '/v1/secret_keys', { name: 'short-lived' });
    const secret = key.secret_key as string;
    await usable(secret);
    await cached(b64({ secret_key: secret }));
    await api('DELETE', `/v1/secret_keys/${key.secret_key_id as string}`);
    const raw = await forward(secret);
    expect(raw.status).toBe(401);
    expect(await codeOf(raw)).toBe('unauthorized');
    expect((await forward(b64({ secret_key: secret }))).status).toBe(401);
  });

  it('a deleted customer and a deleted meter are refused on the next request', async () => {
    const customer = await api('POST', '/v1/customers', {});
    const meter = await api('POST', '/v1/meters', { name: 'Chat', rate_type: 'fixed', tiers: [{ start: '0', rate: '1' }] });
    await creditWallet(t.storage, (customer.wallet as { wallet_id: string }).wallet_id, parseMoney('5'), new Date().toISOString());
    const token = b64({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug });
    await cached(token);
    await api('DELETE', `/v1/customers/${customer.customer_id as string}`);
    expect((await forward(token)).status).toBe(401);

    const other = await api('POST', '/v1/customers', {});
    await creditWallet(t.storage, (other.wallet as { wallet_id: string }).wallet_id, parseMoney('5'), new Date().toISOString());
    const second = b64({ secret_key: t.merchant.secretKey, customer_id: other.customer_id, meter_slug: meter.meter_slug });
    await cached(second);
    await api('DELETE', `/v1/meters/${meter.meter_id as string}`);
    expect((await forward(second)).status).toBe(401);
  });

  it('a paused and then a revoked spend key are refused on the next request', async () => {
    const key = await api('POST', '/v1/spend_keys', { name: 'k' });
    const secret = key.key as string;
    await cached(secret);
    await api('PATCH', `/v1/spend_keys/${key.spend_key_id as string}`, { status: 'paused' });
    const paused = await forward(secret);
    expect(paused.status).toBe(403);
    expect(await codeOf(paused)).toBe('spend_key_paused');
    await api('PATCH', `/v1/spend_keys/${key.spend_key_id as string}`, { status: 'active' });
    await cached(secret);
    await api('DELETE', `/v1/spend_keys/${key.spend_key_id as string}`);
    expect((await forward(secret)).status).toBe(401);
  });

  it("a spend key's own use (counters, token bucket) does not empty the cache; a change of its settings does", async () => {
    const cache = t.app.gateway.credentials;
    const key = await api('POST', '/v1/spend_keys', { name: 'counted', rate_limit: { rpm: 1000 } });
    await cached(key.key as string);
    await t.storage.db.updateTable('spend_keys').set({ last_used_at: new Date().toISOString() }).where('id', '=', 'none').execute();
    expect(cache.size).toBeGreaterThan(0);
    await t.storage.db.updateTable('spend_keys').set({ name: 'renamed' }).where('id', '=', 'none').execute();
    expect(cache.size).toBe(0);
  });

  it("a subscription's start, plan or status change, or a plan's meters changing, empties the cache (whether plan credit pays); a renewal's claim does not", async () => {
    const cache = t.app.gateway.credentials;
    const meter = await api('POST', '/v1/meters', { name: 'Linked', rate_type: 'fixed', tiers: [{ start: '0', rate: '1' }] });
    const plan = await api('POST', '/v1/plans', { name: 'Free', period_amount: '0', included_credit: '5', billing_interval: 'month', meter_ids: [meter.meter_id] });
    const customer = await api('POST', '/v1/customers', {});
    const walletId = (customer.wallet as { wallet_id: string }).wallet_id;
    await creditWallet(t.storage, walletId, parseMoney('5'), new Date().toISOString());
    const token = b64({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug });
    await cached(token);
    const drawsPlanCredit = async () => (await resolveCredential(t.storage, cache, token, new Date())).drawsPlanCredit;
    expect(await drawsPlanCredit()).toBe(false);

    // Subscribing (an insert) is seen on the next request: the cycle credit pays it.
    const subscription = await api('POST', '/v1/subscriptions', { customer_id: customer.customer_id, plan_id: plan.plan_id });
    expect(await drawsPlanCredit()).toBe(true);
    const res = await forward(token);
    await res.text();
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id'));
    const wallet = await t.storage.db.selectFrom('wallets').selectAll().where('id', '=', walletId).executeTakeFirstOrThrow();
    expect(parseMoney(record.total_wallet_cost)).toBeGreaterThan(0n);
    expect(BigInt(wallet.cycle_credit)).toBe(parseMoney('5') - parseMoney(record.total_wallet_cost));

    const subscriptionId = (subscription.subscription as Json).subscription_id as string;
    await cached(token);
    await t.storage.db.updateTable('subscriptions').set({ claimed_until: null }).where('id', '=', 'none').execute();
    expect(cache.size).toBeGreaterThan(0);
    await t.storage.db.updateTable('subscriptions').set({ status: 'cancelled' }).where('id', '=', subscriptionId).execute();
    expect(cache.size).toBe(0);
    expect(await drawsPlanCredit()).toBe(false);

    await cached(token);
    await t.storage.db.deleteFrom('plan_meters').where('plan_id', '=', 'none').execute();
    expect(cache.size).toBe(0);
  });
});
