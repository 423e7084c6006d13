import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { freshDatabase } from '../helpers/databases.ts';
import { startGatewayOnMock, type MockGateway } from '../helpers/gateway.ts';

/**
 * Revocation reaches every instance within 100 ms when Redis is configured (decision 0019):
 * a secret key revoked on one instance stops working on another whose credential cache had it,
 * instead of working there for up to the cache's 2 s entry lifetime. Real PostgreSQL and Redis.
 */

const postgres = process.env.TEST_DATABASE_URL;
const redis = process.env.TEST_REDIS_URL;
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const BOUND_MS = 100;

describe.runIf(postgres && redis)('credential revocation across two instances with Redis', () => {
  let a: MockGateway;
  let b: MockGateway;

  beforeAll(async () => {
    const database = await freshDatabase('postgres');
    const opts = { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed' }, env: { REDIS_URL: redis! }, database };
    a = await startGatewayOnMock('postgres', opts);
    b = await startGatewayOnMock('postgres', opts);
  });
  afterAll(async () => {
    for (const gw of [a, b]) {
      await gw?.t.close();
      await gw?.upstream.close();
    }
  });

  it(`a key revoked on one instance is refused by the other within ${BOUND_MS} ms`, async () => {
    await creditWallet(a.t.storage, a.t.merchant.walletId, parseMoney('10'), new Date().toISOString());
    const created = (await a.t.app.inject({ method: 'POST', url: '/v1/secret_keys', headers: a.t.auth(), payload: { name: 'soon revoked' } })).json();
    const forwardOnB = () =>
      fetch(`${b.base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${created.secret_key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
      }).then(async (res) => {
        await res.arrayBuffer();
        return res.status;
      });
    // Instance B now holds the key in its credential cache.
    expect(await forwardOnB()).toBe(200);
    expect(await forwardOnB()).toBe(200);

    const revoked = await a.t.app.inject({ method: 'DELETE', url: `/v1/secret_keys/${created.secret_key_id}`, headers: a.t.auth() });
    expect(revoked.statusCode).toBe(200);
    const revokedAt = Date.now();
    const statuses: number[] = [];
    while (Date.now() - revokedAt < BOUND_MS) {
      const status = await forwardOnB();
      statuses.push(status);
      if (status === 401) break;
    }
    expect(statuses.at(-1), `answers on B after the revocation: ${statuses.join(',')}`).toBe(401);
  });
});
