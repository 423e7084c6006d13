import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import Stripe from 'stripe';
import { checkoutSessionRoutes, type CheckoutStandIn } from './stripe-checkout-stand-in.ts';

/**
 * A local HTTP stand-in for the part of Stripe's API the adapter uses (customers, PaymentMethod
 * attach, PaymentIntents create/retrieve/cancel), so the real `stripe` package talks to it over
 * loopback. It checks what the package sends — the secret key, an API version, form encoding, an
 * Idempotency-Key on every POST — and answers a repeated Idempotency-Key with its first answer, as
 * Stripe does. Stripe's test PaymentMethods decide the outcome:
 *
 * - `pm_card_visa`: succeeds;
 * - `pm_card_chargeDeclined`: declined (402 card_error, the intent `requires_payment_method`);
 * - `pm_card_authenticationRequired`: `requires_action` when the customer is present, declined
 *   (`authentication_required`) off-session.
 *
 * Tests change an intent as Stripe would once the customer acts (`setIntentStatus`).
 *
 * It also stands in for Stripe Checkout (stripe-checkout-stand-in.ts): Checkout Sessions through
 * the API, their hosted card page at `/c/pay/<id>` on the same origin, and signed webhook events
 * sent to Tollgate once `sendWebhooksTo` names it.
 */
export type StandInRequest = { method: string; path: string; params: Record<string, string>; idempotencyKey: string | undefined };

export type Intent = Record<string, unknown> & { id: string; status: string };

/** What a saved card does when charged later with nobody present. */
export type OffSession = 'succeeds' | 'declines' | 'authentication_required';
export type Card = { brand: string; last4: string; offSession: OffSession };

/** Where the stand-in sends Stripe's events, signed with `secret` at `now()` (the app's clock). */
export type WebhookTarget = { url: string; secret: string; now: () => number };
/** `immediate`: an event is delivered before the customer is redirected; `held`: kept until `deliverHeld`. */
export type WebhookTiming = 'immediate' | 'held';
export type Delivery = { eventId: string; type: string; status: number; body: string };

export type StripeStandIn = {
  url: string;
  requests: StandInRequest[];
  /** Problems with what the package sent (a test asserts there are none). */
  problems: string[];
  intents: Map<string, Intent>;
  setIntentStatus(id: string, status: string, lastError?: string): void;
  /** Stripe Checkout: its sessions by id (for assertions). */
  checkoutSessions: CheckoutStandIn['sessions'];
  /** Expires an open Checkout Session as Stripe does when its time runs out. */
  expireCheckoutSession(id: string): void;
  /** Tollgate's webhook endpoint and secret: events are sent there from now on. */
  sendWebhooksTo(target: WebhookTarget): void;
  /** Whether events wait for `deliverHeld` (the redirect first) or go at once (the event first). */
  setWebhookTiming(timing: WebhookTiming): void;
  /** Delivers the events held so far, in order, and answers what Tollgate said to each. */
  deliverHeld(): Promise<Delivery[]>;
  /** Every delivery made, in order. */
  deliveries: Delivery[];
  /**
   * While on, every request is carried out (an intent is created and kept) but never answered: the
   * connection is dropped, as when Stripe took a payment and the answer was lost.
   */
  dropAnswers(on: boolean): void;
  /** Shuts the stand-in down (connections refused, open ones closed); `up` listens again on the same port, state kept. */
  down(): Promise<void>;
  up(): Promise<void>;
  close(): Promise<void>;
};

/** Stripe's test PaymentMethods; cards saved on the hosted page join them. */
const TEST_METHODS: Record<string, Card> = {
  pm_card_visa: { brand: 'visa', last4: '4242', offSession: 'succeeds' },
  pm_card_chargeDeclined: { brand: 'visa', last4: '0002', offSession: 'declines' },
  pm_card_authenticationRequired: { brand: 'visa', last4: '3184', offSession: 'authentication_required' },
};

export async function startStripeStandIn(secretKey: string): Promise<StripeStandIn> {
  const requests: StandInRequest[] = [];
  const problems: string[] = [];
  const intents = new Map<string, Intent>();
  const methods = new Map<string, Card>(Object.entries(TEST_METHODS));
  const answered = new Map<string, { status: number; body: unknown }>();
  let n = 0;
  let dropping = false;
  const nextId = (prefix: string) => `${prefix}_standin${String(++n).padStart(6, '0')}`;

  const paymentMethod = (id: string, customer: string | null) => {
    const card = methods.get(id) ?? { brand: 'visa', last4: '0000' };
    return { id, object: 'payment_method', type: 'card', card: { brand: card.brand, last4: card.last4 }, customer };
  };
  const present = (intent: Intent, params: Record<string, string>) =>
    Object.values(params).includes('payment_method') && typeof intent.payment_method === 'string'
      ? { ...intent, payment_method: paymentMethod(intent.payment_method, intent.customer as string) }
      : intent;
  const cardError = (code: string, message: string, intent: Intent | undefined) => ({
    status: 402,
    body: { error: { type: 'card_error', code, message, ...(intent ? { payment_intent: intent } : {}) } },
  });

  function createIntent(params: Record<string, string>): { status: number; body: unknown } {
    const pm = params.payment_method ?? '';
    const card = methods.get(pm);
    if (!card) return { status: 400, body: { error: { type: 'invalid_request_error', code: 'resource_missing', message: `No such PaymentMethod: '${pm}'` } } };
    const offSession = params.off_session === 'true';
    const intent: Intent = {
      id: nextId('pi'),
      object: 'payment_intent',
      amount: Number(params.amount),
      currency: params.currency,
      customer: params.customer ?? null,
      payment_method: pm,
      description: params.description ?? null,
      metadata: Object.fromEntries(Object.entries(params).flatMap(([k, v]) => (k.startsWith('metadata[') ? [[k.slice(9, -1), v]] : []))),
      status: 'succeeded',
      last_payment_error: null,
    };
    intents.set(intent.id, intent);
    if (card.offSession === 'declines') {
      Object.assign(intent, { status: 'requires_payment_method', last_payment_error: { code: 'card_declined', message: 'Your card was declined.' } });
      return cardError('card_declined', 'Your card was declined.', intent);
    }
    // Cards saved on the hosted page were authenticated there: only one whose issuer always asks is refused later.
    if (card.offSession === 'authentication_required' || (pm === 'pm_card_authenticationRequired' && !offSession)) {
      if (offSession) {
        Object.assign(intent, { status: 'requires_payment_method', last_payment_error: { code: 'authentication_required', message: 'This payment requires authentication.' } });
        return cardError('authentication_required', 'This payment requires authentication.', intent);
      }
      Object.assign(intent, { status: 'requires_action', next_action: { type: 'use_stripe_sdk' } });
    }
    return { status: 200, body: present(intent, params) };
  }

  function route(method: string, path: string, params: Record<string, string>): { status: number; body: unknown } {
    const checkoutAnswer = checkout.api(method, path, params);
    if (checkoutAnswer) return checkoutAnswer;
    if (method === 'POST' && path === '/v1/customers') return { status: 200, body: { id: nextId('cus'), object: 'customer', metadata: {} } };
    let m = /^\/v1\/payment_methods\/([^/]+)\/attach$/.exec(path);
    if (method === 'POST' && m) {
      if (m[1] === 'pm_card_chargeDeclined') return cardError('card_declined', 'Your card was declined.', undefined);
      return { status: 200, body: paymentMethod(m[1]!, params.customer ?? null) };
    }
    if (method === 'POST' && path === '/v1/payment_intents') return createIntent(params);
    m = /^\/v1\/payment_intents\/([^/]+)(\/cancel)?$/.exec(path);
    const intent = m ? intents.get(m[1]!) : undefined;
    if (m && !intent) return { status: 404, body: { error: { type: 'invalid_request_error', code: 'resource_missing', message: 'No such payment_intent' } } };
    if (method === 'GET' && m && !m[2]) return { status: 200, body: present(intent!, params) };
    if (method === 'POST' && m?.[2]) {
      intent!.status = 'canceled';
      return { status: 200, body: intent };
    }
    return { status: 404, body: { error: { type: 'invalid_request_error', message: `Unrecognized request URL (${method}: ${path})` } } };
  }

  // Events: signed as Stripe signs them, at the app's time, delivered now or held.
  let target: WebhookTarget | null = null;
  let timing: WebhookTiming = 'immediate';
  const held: { id: string; type: string; object: unknown }[] = [];
  const deliveries: Delivery[] = [];
  async function deliver(event: { id: string; type: string; object: unknown }): Promise<Delivery> {
    if (!target) throw new Error('the stand-in has no webhook target');
    const now = Math.floor(target.now() / 1000);
    const payload = JSON.stringify({ id: event.id, object: 'event', type: event.type, api_version: Stripe.API_VERSION, created: now, data: { object: event.object } });
    const header = Stripe.webhooks.generateTestHeaderString({ payload, secret: target.secret, timestamp: now });
    const res = await fetch(target.url, { method: 'POST', headers: { 'content-type': 'application/json', 'stripe-signature': header }, body: payload });
    const delivery = { eventId: event.id, type: event.type, status: res.status, body: await res.text() };
    deliveries.push(delivery);
    return delivery;
  }
  async function emit(type: string, object: unknown): Promise<void> {
    if (!target) return;
    const event = { id: nextId('evt'), type, object: structuredClone(object) };
    if (timing === 'held') held.push(event);
    else await deliver(event);
  }
  const checkout = checkoutSessionRoutes({ nextId, intents, methods, emit, paymentMethod, base: () => base });

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://stand-in');
      const form = Buffer.concat(chunks).toString('utf8');
      const params = Object.fromEntries(new URLSearchParams(req.method === 'GET' ? url.search : form));
      // Stripe Checkout's own page, where a browser (not the package) pays (and asks for a favicon).
      if (!url.pathname.startsWith('/v1/')) return void checkout.page(req.method ?? '', url.pathname, params, res);
      const idempotencyKey = req.headers['idempotency-key'] as string | undefined;
      requests.push({ method: req.method ?? '', path: url.pathname, params, idempotencyKey });
      const where = `${req.method} ${url.pathname}`;
      if (req.headers.authorization !== `Bearer ${secretKey}`) problems.push(`${where}: authorization ${req.headers.authorization}`);
      if (!req.headers['stripe-version']) problems.push(`${where}: no Stripe-Version`);
      if (req.method === 'POST') {
        if (!idempotencyKey) problems.push(`${where}: no Idempotency-Key`);
        if (!String(req.headers['content-type']).startsWith('application/x-www-form-urlencoded')) problems.push(`${where}: content-type ${req.headers['content-type']}`);
      }
      const replayKey = idempotencyKey && `${where} ${idempotencyKey}`;
      const answer = (replayKey && answered.get(replayKey)) || route(req.method ?? '', url.pathname, params);
      if (replayKey) answered.set(replayKey, answer);
      if (dropping) return void req.socket.destroy();
      res.writeHead(answer.status, { 'content-type': 'application/json', 'request-id': `req_${n}` });
      res.end(JSON.stringify(answer.body));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const base = `http://127.0.0.1:${port}`;
  return {
    url: base,
    requests,
    problems,
    intents,
    checkoutSessions: checkout.sessions,
    expireCheckoutSession: (id) => checkout.expire(id),
    sendWebhooksTo(t) {
      target = t;
    },
    setWebhookTiming(t) {
      timing = t;
    },
    async deliverHeld() {
      const sent: Delivery[] = [];
      for (const event of held.splice(0)) sent.push(await deliver(event));
      return sent;
    },
    deliveries,
    setIntentStatus(id, status, lastError) {
      const intent = intents.get(id);
      if (!intent) throw new Error(`no intent ${id}`);
      intent.status = status;
      intent.last_payment_error = lastError ? { code: 'card_declined', message: lastError } : null;
    },
    dropAnswers(on) {
      dropping = on;
    },
    down: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
    up: () => new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve)),
    close: () => new Promise<void>((resolve) => (server.listening ? server.close(() => resolve()) : resolve())),
  };
}
