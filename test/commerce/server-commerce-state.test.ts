import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { startServer } from '../../src/main.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { openStorage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { TestClock } from '../helpers/clock.ts';
import { runTempDir } from '../helpers/databases.ts';

/**
 * The server builds one CommerceState and gives it to the app and to its background loops: a
 * method the checkout keeps while its payment awaits confirmation (or an auto top-up's purchase
 * turn) is seen by the payment reconciliation that may settle it. SQLite has no advisory lock
 * behind the in-process purchase turns, so two states would let two purchases run at once.
 */
describe('the server and its background loops share one CommerceState', () => {
  it("a card a checkout keeps while its payment awaits confirmation is in the state the reconciliation reads", async () => {
    const databaseUrl = `sqlite:${join(runTempDir(), 'commerce-state.db')}`;
    const setup = openStorage(databaseUrl);
    await migrateToLatest(setup);
    const { secretKey } = await createMerchant(setup, { name: 'Shared state' }, new Date().toISOString());
    await setup.close();

    const server = await startServer(loadConfig({ PORT: '0', DATABASE_URL: databaseUrl, LOG_LEVEL: 'silent' }), { clock: new TestClock() });
    try {
      const api = async (path: string, body: unknown) => {
        const res = await fetch(`${server.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
        expect(res.status, path).toBe(201);
        return res.json();
      };
      const customer = await api('/v1/customers', {});
      const session = await api('/v1/checkout_sessions', { checkout_mode: 'topup', customer_id: customer.customer_id, origin_url: 'https://shop.example.com/' });
      const paid = await fetch(`${server.url}/checkout/pay`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token: session.checkout_session_token, amount: '5', card_number: TEST_CARDS.requiresAction }).toString(),
      });
      expect(paid.status).toBe(200);
      expect(await paid.text()).toContain('Confirm your payment');

      const side = openStorage(databaseUrl);
      try {
        const payment = await side.db.selectFrom('payments').selectAll().where('reference', '=', session.checkout_session_id).executeTakeFirstOrThrow();
        expect(payment.status).toBe('requires_action');
        expect(server.commerceState.savedAwaitingConfirmation.get(payment.id)).toMatchObject({ label: 'Test card ending 3155' });
      } finally {
        await side.close();
      }
    } finally {
      await server.stop();
    }
  });
});
