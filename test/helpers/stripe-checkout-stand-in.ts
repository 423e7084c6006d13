import type { ServerResponse } from 'node:http';
import type { Card, Intent } from './stripe-stand-in.ts';

/**
 * The Stripe Checkout part of the Stripe stand-in: Checkout Sessions through the API (create,
 * retrieve with expansions, expire) and the hosted page a browser pays on, at `/c/pay/<id>`.
 * Card numbers on the page behave as Stripe's test cards do:
 *
 * - `4242 4242 4242 4242` pays; the card is saved and pays later off-session too;
 * - `4000 0000 0000 0002` is declined on the page (the customer may try another card);
 * - `4000 0025 0000 3155` asks for a 3-D Secure step on the page (complete or fail it); once
 *   saved, later off-session charges succeed;
 * - `4000 0027 6000 3184` asks for 3-D Secure on the page and again on every later charge, which
 *   off-session is refused (`authentication_required`);
 * - `4000 0000 0000 0341` pays on the page; later charges are declined.
 *
 * Paying completes the session and its PaymentIntent (or, in setup mode, a SetupIntent), emits
 * `payment_intent.succeeded` and `checkout.session.completed` (a decline emits
 * `payment_intent.payment_failed`), then redirects the browser to the session's success_url.
 */
export type CheckoutSession = {
  id: string;
  object: 'checkout.session';
  mode: 'payment' | 'setup';
  status: 'open' | 'complete' | 'expired';
  payment_status: 'unpaid' | 'paid' | 'no_payment_required';
  url: string;
  success_url: string;
  cancel_url: string;
  client_reference_id: string | null;
  expires_at: number;
  amount_total: number | null;
  currency: string;
  customer: string | null;
  metadata: Record<string, string>;
  payment_intent: string | null;
  setup_intent: string | null;
  /** Not Stripe's: what the page names as bought, and the metadata its intent gets. */
  item: string;
  intentMetadata: Record<string, string>;
  setupFutureUsage: string | null;
};

type Answer = { status: number; body: unknown };

export type CheckoutStandInDeps = {
  nextId(prefix: string): string;
  intents: Map<string, Intent>;
  methods: Map<string, Card>;
  emit(type: string, object: unknown): Promise<void>;
  paymentMethod(id: string, customer: string | null): unknown;
  base(): string;
};

export type CheckoutStandIn = {
  sessions: Map<string, CheckoutSession>;
  /** Answers a Checkout API call, or null when the path is not one. */
  api(method: string, path: string, params: Record<string, string>): Answer | null;
  /** Expires an open session as Stripe does when its time runs out (its event follows). */
  expire(id: string): void;
  /** Serves the hosted page. */
  page(method: string, path: string, params: Record<string, string>, res: ServerResponse): void;
};

type PageCard = { behaviour: 'pays' | 'declined' | 'authenticate'; card: Card };

const PAGE_CARDS: Record<string, PageCard> = {
  '4242424242424242': { behaviour: 'pays', card: { brand: 'visa', last4: '4242', offSession: 'succeeds' } },
  '4000000000000002': { behaviour: 'declined', card: { brand: 'visa', last4: '0002', offSession: 'declines' } },
  '4000002500003155': { behaviour: 'authenticate', card: { brand: 'visa', last4: '3155', offSession: 'succeeds' } },
  '4000002760003184': { behaviour: 'authenticate', card: { brand: 'visa', last4: '3184', offSession: 'authentication_required' } },
  '4000000000000341': { behaviour: 'pays', card: { brand: 'visa', last4: '0341', offSession: 'declines' } },
};

const invalid = (message: string): Answer => ({ status: 400, body: { error: { type: 'invalid_request_error', message } } });

/** Stripe's nested form fields under a prefix, e.g. `metadata[…]`. */
function nested(params: Record<string, string>, prefix: string): Record<string, string> {
  return Object.fromEntries(Object.entries(params).flatMap(([k, v]) => (k.startsWith(`${prefix}[`) && k.endsWith(']') && !k.slice(prefix.length + 1, -1).includes('[') ? [[k.slice(prefix.length + 1, -1), v]] : [])));
}

export function checkoutSessionRoutes(deps: CheckoutStandInDeps): CheckoutStandIn {
  const sessions = new Map<string, CheckoutSession>();
  const setupIntents = new Map<string, Record<string, unknown> & { id: string }>();

  function create(params: Record<string, string>): Answer {
    const mode = params.mode;
    if (mode !== 'payment' && mode !== 'setup') return invalid('mode must be payment or setup');
    if (!params.success_url || !params.cancel_url) return invalid('success_url and cancel_url are required');
    const amount = mode === 'payment' ? Number(params['line_items[0][price_data][unit_amount]']) : null;
    if (mode === 'payment' && !(Number.isInteger(amount) && amount! > 0)) return invalid('line_items[0][price_data][unit_amount] must be a positive integer');
    const id = deps.nextId('cs_test');
    const session: CheckoutSession = {
      id,
      object: 'checkout.session',
      mode,
      status: 'open',
      payment_status: 'unpaid',
      url: `${deps.base()}/c/pay/${id}`,
      success_url: params.success_url,
      cancel_url: params.cancel_url,
      client_reference_id: params.client_reference_id ?? null,
      expires_at: Number(params.expires_at),
      amount_total: amount,
      currency: params['line_items[0][price_data][currency]'] ?? params.currency ?? 'usd',
      customer: params.customer ?? null,
      metadata: nested(params, 'metadata'),
      payment_intent: null,
      setup_intent: null,
      item: params['line_items[0][price_data][product_data][name]'] ?? 'Save your card',
      intentMetadata: mode === 'payment' ? nested(params, 'payment_intent_data[metadata]') : nested(params, 'setup_intent_data[metadata]'),
      setupFutureUsage: params['payment_intent_data[setup_future_usage]'] ?? null,
    };
    sessions.set(id, session);
    return { status: 200, body: present(session, false) };
  }

  /** A session as the API shows it; `expand`: its intent (and that intent's method) as objects. */
  function present(session: CheckoutSession, expand: boolean): unknown {
    const { item: _item, intentMetadata: _meta, setupFutureUsage: _sfu, ...shown } = session;
    if (!expand) return shown;
    const withMethod = (o: (Record<string, unknown> & { payment_method?: unknown }) | undefined) =>
      o && typeof o.payment_method === 'string' ? { ...o, payment_method: deps.paymentMethod(o.payment_method, session.customer) } : (o ?? null);
    return {
      ...shown,
      payment_intent: session.payment_intent ? withMethod(deps.intents.get(session.payment_intent)) : null,
      setup_intent: session.setup_intent ? withMethod(setupIntents.get(session.setup_intent)) : null,
    };
  }

  function expire(session: CheckoutSession): Answer {
    if (session.status !== 'open') return invalid('Only Checkout Sessions with a status in ["open"] can be expired.');
    session.status = 'expired';
    const intent = session.payment_intent ? deps.intents.get(session.payment_intent) : undefined;
    if (intent) intent.status = 'canceled';
    void deps.emit('checkout.session.expired', present(session, false));
    return { status: 200, body: present(session, false) };
  }

  function api(method: string, path: string, params: Record<string, string>): Answer | null {
    if (method === 'POST' && path === '/v1/checkout/sessions') return create(params);
    const m = /^\/v1\/checkout\/sessions\/([^/]+)(\/expire)?$/.exec(path);
    if (!m) return null;
    const session = sessions.get(m[1]!);
    if (!session) return { status: 404, body: { error: { type: 'invalid_request_error', code: 'resource_missing', message: `No such checkout.session: '${m[1]}'` } } };
    if (method === 'GET' && !m[2]) return { status: 200, body: present(session, Object.keys(params).some((k) => k.startsWith('expand'))) };
    if (method === 'POST' && m[2]) return expire(session);
    return null;
  }

  /** The session's PaymentIntent, made at the first attempt as Stripe does. */
  function intentOf(session: CheckoutSession): Intent {
    const existing = session.payment_intent ? deps.intents.get(session.payment_intent) : undefined;
    if (existing) return existing;
    const intent: Intent = {
      id: deps.nextId('pi'),
      object: 'payment_intent',
      amount: session.amount_total,
      currency: session.currency,
      customer: session.customer,
      payment_method: null,
      description: null,
      metadata: session.intentMetadata,
      setup_future_usage: session.setupFutureUsage,
      status: 'requires_payment_method',
      last_payment_error: null,
    };
    deps.intents.set(intent.id, intent);
    session.payment_intent = intent.id;
    return intent;
  }

  async function fail(session: CheckoutSession, code: string, message: string): Promise<void> {
    if (session.mode === 'setup') return;
    const intent = intentOf(session);
    Object.assign(intent, { status: 'requires_payment_method', last_payment_error: { code, message } });
    await deps.emit('payment_intent.payment_failed', intent);
  }

  async function pay(session: CheckoutSession, card: Card): Promise<void> {
    const method = deps.nextId('pm');
    deps.methods.set(method, card);
    session.status = 'complete';
    if (session.mode === 'setup') {
      const setup = { id: deps.nextId('seti'), object: 'setup_intent', status: 'succeeded', usage: 'off_session', customer: session.customer, payment_method: method, metadata: session.intentMetadata };
      setupIntents.set(setup.id, setup);
      session.setup_intent = setup.id;
      session.payment_status = 'no_payment_required';
    } else {
      const intent = intentOf(session);
      Object.assign(intent, { status: 'succeeded', payment_method: method, last_payment_error: null });
      session.payment_status = 'paid';
      await deps.emit('payment_intent.succeeded', intent);
    }
    await deps.emit('checkout.session.completed', present(session, false));
  }

  async function servePage(method: string, path: string, params: Record<string, string>, res: ServerResponse): Promise<void> {
    const m = /^\/c\/pay\/([^/]+)(\/authenticate)?$/.exec(path);
    const session = m ? sessions.get(m[1]!) : undefined;
    if (!session) return send(res, 404, '<h1>Not found</h1>');
    if (session.status !== 'open') return send(res, 410, `<h1>This checkout is no longer available</h1><p>Its status is ${session.status}.</p>`);
    if (method === 'GET') return send(res, 200, form(session, null));
    const number = (params.card ?? '').replace(/[\s-]/g, '');
    const known = PAGE_CARDS[number];
    if (!known) return send(res, 402, form(session, 'Your card number is invalid.'));
    if (m![2]) {
      if (params.action !== 'complete') {
        await fail(session, 'payment_intent_authentication_failure', 'We are unable to authenticate your payment method.');
        return send(res, 402, form(session, 'We are unable to authenticate your payment method. Choose another card and try again.'));
      }
      await pay(session, known.card);
      return redirect(res, session.success_url);
    }
    if (known.behaviour === 'declined') {
      await fail(session, 'card_declined', 'Your card was declined.');
      return send(res, 402, form(session, 'Your card was declined.'));
    }
    if (known.behaviour === 'authenticate') return send(res, 200, authenticate(session, number));
    await pay(session, known.card);
    return redirect(res, session.success_url);
  }

  function page(method: string, path: string, params: Record<string, string>, res: ServerResponse): void {
    servePage(method, path, params, res).catch((e: unknown) => send(res, 500, `<h1>Stand-in error</h1><pre>${esc(String(e))}</pre>`));
  }

  return {
    sessions,
    api,
    page,
    expire: (id) => {
      const session = sessions.get(id);
      if (!session || expire(session).status !== 200) throw new Error(`checkout session ${id} is not open`);
    },
  };
}

function amountOf(session: CheckoutSession): string {
  return session.amount_total === null ? '' : `${(session.amount_total / 100).toFixed(2)} ${session.currency.toUpperCase()}`;
}

function form(session: CheckoutSession, error: string | null): string {
  const action = session.mode === 'setup' ? 'Save card' : `Pay ${amountOf(session)}`;
  return `<h1>Stripe test checkout</h1>
<p id="item">${esc(session.item)}</p>
${session.amount_total === null ? '' : `<p id="amount">${esc(amountOf(session))}</p>`}
${error ? `<p role="alert">${esc(error)}</p>` : ''}
<form method="post" action="/c/pay/${esc(session.id)}">
<label for="card">Card number</label><input id="card" name="card" autocomplete="cc-number" inputmode="numeric">
<button type="submit">${esc(action)}</button>
</form>
<a href="${esc(session.cancel_url)}">Back</a>`;
}

function authenticate(session: CheckoutSession, number: string): string {
  const button = (action: string, label: string) =>
    `<form method="post" action="/c/pay/${esc(session.id)}/authenticate"><input type="hidden" name="card" value="${esc(number)}"><input type="hidden" name="action" value="${action}"><button type="submit">${label}</button></form>`;
  return `<h1>3D Secure test page</h1>
<p>Your bank asks you to authenticate this payment of ${esc(amountOf(session))}.</p>
${button('complete', 'Complete authentication')}
${button('fail', 'Fail authentication')}`;
}

function send(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8' });
  res.end(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Stripe stand-in</title></head><body><main>${body}</main></body></html>`);
}

function redirect(res: ServerResponse, location: string): void {
  res.writeHead(303, { location });
  res.end();
}

function esc(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}
