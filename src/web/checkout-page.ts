import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import {
  confirmCheckout,
  displayAmount,
  payCheckout,
  purchaseOf,
  sessionOpen,
  type PayInput,
  type PayResult,
  type Purchase,
} from '../commerce/checkout.ts';
import { returnFromHostedCheckout, startHostedCheckout, type HostedPayResult } from '../commerce/hosted-checkout.ts';
import { settleStaleCheckoutAttempt } from '../commerce/reconciliation.ts';
import type { PurchaseDeps } from '../commerce/subscriptions.ts';
import { dateOf } from '../domain/clock.ts';
import { isValidEmail } from '../domain/email.ts';
import { MAX_AMOUNT_UNITS, MoneyFormatError, parseMoney } from '../domain/money.ts';
import { paymentProviderUnavailable } from '../http/error-handler.ts';
import { PROVIDER_RETRY_AFTER_S } from '../payments/types.ts';
import type { RateLimiter } from '../http/rate-limit.ts';
import { hashSecret } from '../domain/secrets.ts';
import { presentCustomer } from '../services/customers.ts';
import { receiptKeyMatches, receiptOf, receiptPath, type Receipt } from '../commerce/receipts.ts';
import { findCheckoutSessionById, findCheckoutSessionByTokenHash, type CheckoutSessionRow } from '../storage/checkout-sessions.ts';
import { isSessionLocked, recordDecline, refusalOfAttempt, sessionLocked, type AttemptRefusal } from './checkout-limits.ts';
import { CHECKOUT_CSS, CHECKOUT_JS, COMPLETION_ISLAND } from './checkout-assets.ts';
import { html, jsonIsland, unsafeRaw } from './html.ts';
import { sendPage } from './layout.ts';

const CHECKOUT_STYLESHEET = '/checkout/assets/checkout.css';
const CHECKOUT_SCRIPT = '/checkout/assets/checkout.js';

/**
 * The hosted checkout page, opened from a checkout session's token (`/checkout?token=…`), in a
 * window or in an iframe of the session's origin only. Plain HTML forms: it works without
 * JavaScript; the one script (same origin) only tells the opener that checkout completed.
 */
const MAX_TOPUP = parseMoney('10000');

type Form = Record<string, string>;

/** The checkout form: the session token, an amount, a name, an email and the provider's fields. */
export const CHECKOUT_FORM_LIMIT = 8 * 1024;
type Opened = { session: CheckoutSessionRow; token: string };

/**
 * `currency`: what every amount is in (CURRENCY), shown beside each one. `publicBaseUrl`
 * (PUBLIC_BASE_URL): where a provider's hosted page sends the customer back; else the URL the
 * request reached.
 */
export type CheckoutPageDeps = PurchaseDeps & { rateLimiter: RateLimiter; currency: string; publicBaseUrl?: string | undefined };

/**
 * Whether the customer pays on the provider's own page (Stripe Checkout): this page then takes the
 * amount and contact only and sends the customer there. A form that carries the provider's own
 * fields (an integration that collected a Stripe PaymentMethod itself) is still charged here.
 */
function paysOnProviderPage(deps: CheckoutPageDeps, form: Form = {}): boolean {
  return deps.payments.startHostedCheckout !== undefined && !deps.payments.checkoutFields.some((f) => form[f.name]);
}

export function registerCheckoutPage(app: FastifyInstance, deps: CheckoutPageDeps): void {
  // The checkout form and nothing else: other bodies are refused (415) unread.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string', bodyLimit: CHECKOUT_FORM_LIMIT }, (_request, body, done) => {
    done(null, Object.fromEntries(new URLSearchParams(String(body))));
  });

  app.get(CHECKOUT_STYLESHEET, { config: { public: true }, schema: { hide: true } }, async (_request, reply) =>
    reply.type('text/css; charset=utf-8').header('cache-control', 'public, max-age=3600').send(CHECKOUT_CSS),
  );
  app.get(CHECKOUT_SCRIPT, { config: { public: true }, schema: { hide: true } }, async (_request, reply) =>
    reply.type('text/javascript; charset=utf-8').header('cache-control', 'public, max-age=3600').send(CHECKOUT_JS),
  );

  app.get<{ Querystring: { token?: string } }>('/checkout', { config: { public: true }, schema: { hide: true } }, async (request, reply) => {
    const opened = await open(deps, request.query.token, reply);
    if (!opened) return reply;
    if (await isSessionLocked(deps, opened.session)) return refused(deps, reply, opened, sessionLocked());
    return page(deps, reply, opened.session, await checkoutForm(deps, opened, null));
  });

  app.get<{ Querystring: { session?: string; key?: string } }>('/checkout/receipt', { config: { public: true }, schema: { hide: true } }, async (request, reply) => {
    const { session: id, key } = request.query;
    const session = id && key ? await findCheckoutSessionById(deps.storage.db, id) : undefined;
    const receipt = session && receiptKeyMatches(session, key!) ? await receiptOf(deps, session) : null;
    if (!session || !receipt) return messagePage(reply.status(404), null, 'Receipt not found', 'This receipt link is not valid.');
    const merchant = await merchantName(deps, session.merchant_id);
    // A receipt is a page of its own, never framed.
    return send(reply.status(200), null, merchant, `<h1>Receipt</h1>\n<p>Paid to ${esc(merchant)}.</p>\n${recapList(receipt, deps.currency)}`, null);
  });

  app.post<{ Body: Form }>('/checkout/pay', { config: { public: true }, bodyLimit: CHECKOUT_FORM_LIMIT, schema: { hide: true } }, async (request, reply) => {
    const form = request.body ?? {};
    const opened = await open(deps, form.token, reply);
    if (!opened) return reply;
    const refusal = await refusalOfAttempt(deps, opened.session, request.ip);
    if (refusal) return refused(deps, reply, opened, refusal, form);
    const input = await payInput(deps, opened.session, form);
    if (typeof input === 'string') return page(deps, reply.status(400), opened.session, await checkoutForm(deps, opened, input, form));
    // An earlier attempt whose request died is settled first: paid (shown so), or freed for this one.
    const settled = await settleStaleCheckoutAttempt(deps, opened.session, input.customerEventData, input.at);
    if (settled) return showResult(deps, request, reply, opened, { status: 'completed', session: settled }, form);
    const result: HostedPayResult = paysOnProviderPage(deps, form) ? await startHostedCheckout(deps, input, hostedUrls(deps, request, opened)) : await payCheckout(deps, input);
    if (result.status === 'redirect') return reply.redirect(result.url, 303);
    if (result.status === 'failed' && result.declined) await recordDecline(deps, request.ip);
    return showResult(deps, request, reply, opened, result, form);
  });

  // Where the provider's hosted page sends the customer once paid: the payment is read from the
  // provider and settled here, unless its event did so first (then the same success page).
  app.get<{ Querystring: { token?: string } }>('/checkout/return', { config: { public: true }, schema: { hide: true } }, async (request, reply) => {
    const secret = secretOf(request.query.token);
    const session = secret ? await findCheckoutSessionByTokenHash(deps.storage.db, hashSecret(secret)) : undefined;
    if (!session) return messagePage(reply.status(404), null, 'Checkout not found', 'This checkout link is not valid. Ask the shop for a new one.');
    const opened = { session, token: request.query.token! };
    const result = await returnFromHostedCheckout(deps, session, (row) => presentCustomer(row, dateOf(deps.clock)));
    if (result.status === 'failed' && sessionOpen(session, dateOf(deps.clock)) !== 'open') {
      return messagePage(reply.status(410), session, 'Checkout expired', 'This checkout link has expired. Ask the shop for a new one.');
    }
    return showResult(deps, request, reply, opened, result, {});
  });

  app.post<{ Body: Form }>('/checkout/confirm', { config: { public: true }, bodyLimit: CHECKOUT_FORM_LIMIT, schema: { hide: true } }, async (request, reply) => {
    const form = request.body ?? {};
    const opened = await open(deps, form.token, reply);
    if (!opened) return reply;
    const refusal = await refusalOfAttempt(deps, opened.session, request.ip);
    if (refusal) return refused(deps, reply, opened, refusal, form);
    const input = await payInput(deps, opened.session, { ...form, amount: form.amount ?? '0' });
    if (typeof input === 'string') return page(deps, reply.status(400), opened.session, await checkoutForm(deps, opened, input, form));
    const result = await confirmCheckout(deps, input, form.payment_id ?? '');
    if (result.status === 'failed' && result.declined) await recordDecline(deps, request.ip);
    return showResult(deps, request, reply, opened, result, form);
  });
}

/** The session a token opens, or an error page already sent (unknown, expired or used token). */
async function open(deps: CheckoutPageDeps, token: string | undefined, reply: FastifyReply): Promise<Opened | null> {
  const secret = secretOf(token);
  const session = secret ? await findCheckoutSessionByTokenHash(deps.storage.db, hashSecret(secret)) : undefined;
  if (!session) {
    messagePage(reply.status(404), null, 'Checkout not found', 'This checkout link is not valid. Ask the shop for a new one.');
    return null;
  }
  const state = sessionOpen(session, dateOf(deps.clock));
  if (state !== 'open') {
    const why = state === 'completed' ? 'This checkout has already been completed.' : 'This checkout link has expired. Ask the shop for a new one.';
    messagePage(reply.status(410), session, state === 'completed' ? 'Checkout completed' : 'Checkout expired', why);
    return null;
  }
  return { session, token: token! };
}

/** The provider's page sends the customer back to the return page once paid, or to this form. */
function hostedUrls(deps: CheckoutPageDeps, request: FastifyRequest, opened: Opened) {
  const configured = deps.publicBaseUrl ?? `${request.protocol}://${request.host}`;
  const base = configured.endsWith('/') ? configured : `${configured}/`;
  const token = encodeURIComponent(opened.token);
  return { successUrl: `${base}checkout/return?token=${token}`, cancelUrl: `${base}checkout?token=${token}` };
}

/** The token is base64 of JSON {secret, base}; anything else opens nothing. */
function secretOf(token: string | undefined): string | null {
  if (!token || token.length > 2048) return null;
  try {
    const parsed = JSON.parse(Buffer.from(token, 'base64').toString('utf8')) as { secret?: unknown };
    return typeof parsed.secret === 'string' && parsed.secret.startsWith('css_') ? parsed.secret : null;
  } catch {
    return null;
  }
}

async function payInput(deps: CheckoutPageDeps, session: CheckoutSessionRow, form: Form): Promise<PayInput | string> {
  const purchase = await purchaseOf(deps, session);
  let amount: bigint;
  if (purchase.price !== null) amount = purchase.price;
  else {
    try {
      amount = parseMoney((form.amount ?? '').trim());
    } catch (e) {
      if (!(e instanceof MoneyFormatError)) throw e;
      return 'Enter the amount as a number, e.g. 20 or 12.50.';
    }
    if (amount <= 0n || amount > MAX_TOPUP || amount > MAX_AMOUNT_UNITS) return `Enter an amount above 0 and at most ${money(MAX_TOPUP, deps.currency)}.`;
  }
  const [first, ...rest] = (form.name ?? '').trim().split(/\s+/).filter(Boolean);
  const email = (form.email ?? '').trim();
  if (email && !isValidEmail(email)) return 'Enter a valid email address, or leave it empty.';
  const details = Object.fromEntries(deps.payments.checkoutFields.map((f) => [f.name, form[f.name] ?? '']));
  return {
    session,
    purchase,
    amount,
    details,
    contact: { first_name: first ?? null, last_name: rest.length ? rest.join(' ') : null, email: email || null, phone: null },
    customerEventData: (row) => presentCustomer(row, dateOf(deps.clock)),
    at: dateOf(deps.clock),
  };
}

async function showResult(deps: CheckoutPageDeps, request: FastifyRequest, reply: FastifyReply, opened: Opened, result: PayResult, form: Form): Promise<FastifyReply> {
  const { session, token } = opened;
  if (result.status === 'failed') return page(deps, reply.status(402), session, await checkoutForm(deps, opened, result.message, form));
  if (result.status === 'unavailable') return providerUnavailable(deps, request, reply, opened, form);
  if (result.status === 'requires_action') {
    return page(
      deps,
      reply.status(200),
      session,
      `<h1>Confirm your payment</h1>
<p>Your card issuer asks you to confirm this payment.</p>
<form method="post" action="/checkout/confirm">
<input type="hidden" name="token" value="${esc(token)}"><input type="hidden" name="payment_id" value="${esc(result.paymentId)}">
${['amount', 'name', 'email'].map((f) => `<input type="hidden" name="${f}" value="${esc(form[f] ?? '')}">`).join('')}
<button type="submit">Confirm payment</button>
</form>`,
    );
  }
  const done = result.session;
  const receipt = await receiptOf(deps, done);
  const message = { type: 'tollgate:checkout.completed', checkout_session_id: done.id, customer_id: done.connection_id, connection_id: done.connection_id, subscription_id: done.subscription_id };
  return page(
    deps,
    reply.status(200),
    session,
    `<h1>Payment received</h1>
<p class="ok" role="status">Thank you. Your checkout is complete.</p>
${receipt ? recapList(receipt, deps.currency) : ''}
<p><a href="/${esc(receiptPath(done))}">Your receipt</a> (keep this link)</p>
<a class="button" href="${esc(session.origin_url)}">Return to ${esc(new URL(session.origin_url).host)}</a>`,
    message,
  );
}

/**
 * Card-testing limits (checkout-limits.ts): 429 before the provider sees the card. A locked session
 * shows no form; an address over its limit gets the form back with the reason and Retry-After.
 */
async function refused(deps: CheckoutPageDeps, reply: FastifyReply, opened: Opened, refusal: AttemptRefusal, form: Form = {}): Promise<FastifyReply> {
  reply.status(429);
  if (refusal.retryAfterS === null) return page(deps, reply, opened.session, `<h1>Checkout locked</h1><p class="error" role="alert">${esc(refusal.message)}</p>`);
  return page(deps, reply.header('retry-after', String(refusal.retryAfterS)), opened.session, await checkoutForm(deps, opened, refusal.message, form));
}

/**
 * The payment provider did not answer: 503 with Retry-After and nothing charged. A browser (which
 * asks for HTML) gets the form again with the reason; any other client the error envelope.
 */
async function providerUnavailable(deps: CheckoutPageDeps, request: FastifyRequest, reply: FastifyReply, opened: Opened, form: Form): Promise<FastifyReply> {
  if (!(request.headers.accept ?? '').includes('text/html')) throw paymentProviderUnavailable();
  const message = 'The payment provider cannot be reached right now. Nothing was charged; try again in a minute.';
  return page(deps, reply.status(503).header('retry-after', String(PROVIDER_RETRY_AFTER_S)), opened.session, await checkoutForm(deps, opened, message, form));
}

async function merchantName(deps: CheckoutPageDeps, merchantId: string): Promise<string> {
  const row = await deps.storage.db.selectFrom('merchants').select('name').where('id', '=', merchantId).executeTakeFirst();
  return row?.name ?? 'Checkout';
}

/** An amount with its currency ("9.99 USD"): exact, never rounded through a float. */
function money(units: bigint, currency: string): string {
  return `${displayAmount(units)} ${currency}`;
}

function summary(purchase: Purchase, mode: CheckoutSessionRow['mode'], currency: string): string {
  if (purchase.kind === 'plan') {
    const p = purchase.plan;
    const { change, effectiveAt } = purchase.terms;
    const title = change === 'subscribe' ? 'Subscribe to' : change === 'upgrade' ? 'Upgrade to' : 'Change plan to';
    // A plan change's terms (decision 0037): an upgrade starts now; another change at the cycle's end, paid then.
    const when =
      change === 'upgrade'
        ? '<dt>Starts</dt><dd>Now, with a new billing cycle and its full credit; credit left from your current plan is kept.</dd>'
        : change === 'downgrade'
          ? `<dt>Starts</dt><dd>At the end of your current cycle (<time datetime="${esc(effectiveAt!)}">${esc(effectiveAt!.slice(0, 10))}</time>); nothing is charged today.</dd>`
          : '';
    return `<h1>${title} ${esc(p.name)}</h1>
<dl><dt>Price</dt><dd>${money(BigInt(p.period_amount), currency)} per ${esc(p.billing_interval)}</dd>
<dt>Credit each ${esc(p.billing_interval)}</dt><dd>${money(BigInt(p.included_credit), currency)}</dd>${when}</dl>`;
  }
  if (purchase.kind === 'bundle') {
    const b = purchase.bundle;
    return `<h1>Buy ${esc(b.name)}</h1>
<dl><dt>Credit</dt><dd>${money(BigInt(b.credit_amount), currency)}</dd><dt>Price</dt><dd>${money(BigInt(b.cost), currency)}</dd></dl>`;
  }
  return `<h1>${mode === 'onboarding' ? 'Set up your wallet' : 'Top up your wallet'}</h1>`;
}

/** What was paid and credited, on the success page and the receipt. */
function recapList(receipt: Receipt, currency: string): string {
  const when = `${receipt.completedAt.slice(0, 10)} ${receipt.completedAt.slice(11, 16)} UTC`;
  return `<dl class="recap">
<dt>Item</dt><dd>${esc(receipt.item)}</dd>
<dt>Paid</dt><dd>${money(receipt.paid, currency)}</dd>
<dt>Credited</dt><dd>${money(receipt.credited, currency)} ${esc(receipt.creditedAs)}</dd>
<dt>Date</dt><dd><time datetime="${esc(receipt.completedAt)}">${esc(when)}</time></dd>
<dt>Payment reference</dt><dd>${esc(receipt.paymentId)}</dd>
</dl>`;
}

/** The form; after a failed attempt `kept` holds what the customer typed (never the card's fields). */
async function checkoutForm(deps: CheckoutPageDeps, opened: Opened, error: string | null, kept: Form = {}): Promise<string> {
  const { session, token } = opened;
  const purchase = await purchaseOf(deps, session);
  const newCustomer = session.connection_id === null;
  const value = (name: string) => (kept[name] ? ` value="${esc(kept[name])}"` : '');
  const field = (name: string, label: string, attrs: string, hint?: string) =>
    `<label for="${name}">${esc(label)}</label><input id="${name}" name="${name}" ${attrs}${hint ? ` aria-describedby="${name}-hint"` : ''}>` +
    (hint ? `<p class="hint" id="${name}-hint">${esc(hint)}</p>` : '');
  const hosted = paysOnProviderPage(deps);
  const fields = [
    purchase.price === null
      ? field('amount', `Amount (${deps.currency})`, `inputmode="decimal" required autocomplete="transaction-amount" pattern="[0-9]+([.][0-9]{1,10})?"${value('amount')}`)
      : '',
    newCustomer
      ? field('name', 'Name (optional)', `autocomplete="name"${value('name')}`) + field('email', 'Email (optional)', `type="email" autocomplete="email"${value('email')}`)
      : '',
    ...(hosted ? [] : deps.payments.checkoutFields).map((f) =>
      field(f.name, f.label, `required autocomplete="${esc(f.autocomplete)}"${f.inputmode ? ` inputmode="${f.inputmode}"` : ''}${f.pattern ? ` pattern="${esc(f.pattern)}"` : ''}`, f.hint),
    ),
  ].join('\n');
  const laterChange = purchase.kind === 'plan' && purchase.terms.change === 'downgrade';
  const pay = purchase.price === null ? 'Pay' : laterChange ? 'Confirm the plan change' : `Pay ${money(purchase.price, deps.currency)}`;
  // The provider's page cannot be framed: it opens in the whole window, also from a shop's iframe.
  const next = hosted ? '\n<p class="hint">Next you enter your card on the payment provider\'s secure page.</p>' : '';
  return `${summary(purchase, session.mode, deps.currency)}
${error ? `<p class="error" role="alert">${esc(error)}</p>` : ''}
<form method="post" action="/checkout/pay"${hosted ? ' target="_top"' : ''}>${next}
<input type="hidden" name="token" value="${esc(token)}">
${fields}
<button type="submit">${esc(pay)}</button>
</form>`;
}

async function page(
  deps: CheckoutPageDeps,
  reply: FastifyReply,
  session: CheckoutSessionRow,
  content: string,
  message?: Record<string, unknown>,
): Promise<FastifyReply> {
  const name = await merchantName(deps, session.merchant_id);
  const origin = new URL(session.origin_url).origin;
  // The form is redirected to the provider's hosted page: the policy's form-action must allow it.
  const formTargets = paysOnProviderPage(deps) ? [...(deps.payments.hostedCheckoutOrigins ?? [])] : [];
  return send(reply, origin, name, content, message ? { origin, message } : null, formTargets);
}

function messagePage(reply: FastifyReply, session: CheckoutSessionRow | null, title: string, text: string): FastifyReply {
  return send(reply, session ? new URL(session.origin_url).origin : null, 'Checkout', `<h1>${esc(title)}</h1><p>${esc(text)}</p>`, null);
}

/**
 * On the shared page shell (src/web/layout.ts), framable by the session's origin only. `content`
 * is this module's own markup, every value in it escaped with `esc`. The completion message, if
 * any, is a JSON island the one script reads (no inline script).
 */
function send(
  reply: FastifyReply,
  frameOrigin: string | null,
  merchant: string,
  content: string,
  completed: { origin: string; message: Record<string, unknown> } | null,
  formTargets: string[] = [],
): FastifyReply {
  return sendPage(reply, {
    formTargets,
    title: `${merchant} · Checkout`,
    status: reply.statusCode,
    styles: [CHECKOUT_STYLESHEET],
    scripts: completed ? [CHECKOUT_SCRIPT] : [],
    ...(frameOrigin ? { frameAncestors: frameOrigin } : {}),
    main: html`<div class="checkout">
<p class="merchant">${merchant}</p>
<div class="card">
${unsafeRaw(content)}
</div>
${completed ? jsonIsland(COMPLETION_ISLAND, completed) : ''}
</div>`,
  });
}

function esc(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}
