import { payCheckout, purchaseOf, type PayResult } from '../../src/commerce/checkout.ts';
import type { PurchaseDeps } from '../../src/commerce/subscriptions.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { presentCustomer } from '../../src/services/customers.ts';
import type { Storage } from '../../src/storage/db.ts';
import { insertPaymentMethod } from '../../src/storage/subscriptions.ts';
import type { TestApp } from './app.ts';

/**
 * Saves a test card on a customer as a checkout would (renewals and POST /v1/subscriptions charge
 * the customer's latest saved method).
 */
export async function saveTestCard(storage: Storage, merchantId: string, customerId: string, card: keyof typeof TEST_CARDS = 'succeeds'): Promise<void> {
  const last4 = TEST_CARDS[card].slice(-4);
  await insertPaymentMethod(storage.db, {
    merchant_id: merchantId,
    connection_id: customerId,
    provider: 'test',
    provider_ref: `pm_test_${last4}`,
    provider_customer_ref: null,
    label: `Test card ending ${last4}`,
    created_at: new Date().toISOString(),
  });
}

export type PlanInput = Record<string, unknown> & { name: string; period_amount: string; billing_interval: string };

export async function createPlan(t: TestApp, input: PlanInput, key?: string) {
  const res = await t.app.inject({ method: 'POST', url: '/v1/plans', headers: t.auth(key), payload: input });
  if (res.statusCode !== 201) throw new Error(`plan not created: ${res.body}`);
  return res.json();
}

export async function createCustomer(t: TestApp, key?: string): Promise<{ customerId: string; walletId: string }> {
  const customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(key), payload: {} })).json();
  return { customerId: customer.customer_id, walletId: customer.wallet.wallet_id };
}

export async function subscribe(t: TestApp, customerId: string, planId: string, key?: string) {
  return t.app.inject({ method: 'POST', url: '/v1/subscriptions', headers: t.auth(key), payload: { customer_id: customerId, plan_id: planId } });
}

export async function walletBuckets(storage: Storage, walletId: string) {
  const w = await storage.db.selectFrom('wallets').selectAll().where('id', '=', walletId).executeTakeFirstOrThrow();
  const balance = BigInt(w.balance);
  const cycle = BigInt(w.cycle_credit);
  const bundle = BigInt(w.bundle_credit);
  return { balance, cycle, bundle, prepaid: balance - cycle - bundle };
}

export async function eventsOfType(storage: Storage, type: string) {
  const rows = await storage.db.selectFrom('events').selectAll().where('type', '=', type).orderBy('id').execute();
  return rows.map((r) => ({ ...r, data: JSON.parse(r.payload) as Record<string, unknown> }));
}

/**
 * Opens a checkout session as the merchant (a top-up for the customer unless `bundleId` names a
 * credit bundle to buy) and returns its stored row.
 */
export async function openCheckoutSession(t: TestApp, customerId: string, bundleId?: string) {
  const payload = { checkout_mode: bundleId ? 'credit_bundle' : 'topup', origin_url: 'https://shop.example.com/', customer_id: customerId, ...(bundleId ? { credit_bundle_id: bundleId } : {}) };
  const res = await t.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: t.auth(), payload });
  if (res.statusCode !== 201) throw new Error(`checkout session not created: ${res.body}`);
  return t.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', res.json().checkout_session_id).executeTakeFirstOrThrow();
}

/** Pays a checkout session with the test card that succeeds, as the hosted page does (`amount` for a top-up). */
export async function payCheckoutSession(t: TestApp, deps: PurchaseDeps, sessionId: string, amount = '20'): Promise<PayResult> {
  const session = await t.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', sessionId).executeTakeFirstOrThrow();
  return payCheckout(deps, {
    session,
    purchase: await purchaseOf(deps, session),
    amount: session.mode === 'credit_bundle' ? (await purchaseOf(deps, session)).price! : parseMoney(amount),
    details: { card_number: TEST_CARDS.succeeds },
    contact: { first_name: null, last_name: null, email: null, phone: null },
    customerEventData: (row) => presentCustomer(row, dateOf(t.clock)),
    at: dateOf(t.clock),
  });
}
