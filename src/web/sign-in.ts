import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { isValidEmail } from '../domain/email.ts';
import { nowIsoOf, nowOf } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { createMerchant, findMerchantByEmail, MIN_PASSWORD_LENGTH, normalizedEmail, verifyPassword } from '../storage/merchants.ts';
import { html } from './html.ts';
import { sendPage } from './layout.ts';
import { assertCsrf, csrfTokenFor, endSession, loadSession, safeNextPath, startSession } from './session.ts';

/**
 * Wrong passwords allowed per window: per account from one address (so strangers elsewhere cannot
 * lock the owner out), and per address over all accounts (so one address cannot spray many).
 * Only failures count; a success forgets its account's failures from that address (decision 0030).
 */
const FAILURES_PER_ACCOUNT_ADDRESS = 5;
const FAILURES_PER_ADDRESS = 20;
const FAILURE_WINDOW_MS = 15 * 60_000;

type Form = Record<string, string | undefined>;

function formOf(request: FastifyRequest): Form {
  return (request.body ?? {}) as Form;
}

function field(name: string, label: string, type: string, value = '', autocomplete = ''): ReturnType<typeof html> {
  return html`<label for="${name}">${label}</label>
<input id="${name}" name="${name}" type="${type}" value="${value}" required${autocomplete ? html` autocomplete="${autocomplete}"` : ''}>`;
}

function credentialsPage(
  request: FastifyRequest,
  reply: FastifyReply,
  deps: AppDeps,
  kind: 'sign-in' | 'sign-up',
  opts: { error?: string; email?: string; status?: number } = {},
): FastifyReply {
  const next = safeNextPath((request.query as Form).next ?? formOf(request).next);
  const signUp = kind === 'sign-up';
  const title = signUp ? 'Create a merchant account' : 'Sign in';
  return sendPage(reply, {
    title,
    status: opts.status,
    main: html`<div class="card narrow">
<h1>${title}</h1>
${opts.error ? html`<p class="error" role="alert" id="form-error">${opts.error}</p>` : ''}
<form method="post" action="/dashboard/${kind}"${opts.error ? html` aria-describedby="form-error"` : ''}>
<input type="hidden" name="_csrf" value="${csrfTokenFor(request, reply)}">
<input type="hidden" name="next" value="${next}">
${signUp ? field('name', 'Business name', 'text', '', 'organization') : ''}
${field('email', 'Email', 'email', opts.email ?? '', 'username')}
${field('password', 'Password', 'password', '', signUp ? 'new-password' : 'current-password')}
${signUp ? html`<p class="muted">At least ${MIN_PASSWORD_LENGTH} characters.</p>` : ''}
<button type="submit">${signUp ? 'Create account' : 'Sign in'}</button>
</form>
${
  signUp
    ? html`<p>Already have an account? <a href="/dashboard/sign-in">Sign in</a></p>`
    : deps.config.dashboardSignup
      ? html`<p>No account yet? <a href="/dashboard/sign-up">Create one</a></p>`
      : ''
}
</div>`,
  });
}

const failureKeys = (email: string, ip: string) => ({
  pair: `sign-in:failures:account-address:${email}|${ip}`,
  address: `sign-in:failures:address:${ip}`,
});

/** The refusal message when this account from this address, or this address, has failed too often. */
async function refusalOf(deps: AppDeps, email: string, ip: string): Promise<string | null> {
  const now = nowOf(deps);
  const keys = failureKeys(email, ip);
  const minutes = Math.max(1, Math.ceil((Math.ceil((now + 1) / FAILURE_WINDOW_MS) * FAILURE_WINDOW_MS - now) / 60_000));
  if ((await deps.rateLimiter.count(keys.pair, FAILURE_WINDOW_MS, now)) >= FAILURES_PER_ACCOUNT_ADDRESS) {
    return `Too many wrong passwords for this account from your network. Try again in ${minutes} minutes, or ask your operator for a reset link.`;
  }
  if ((await deps.rateLimiter.count(keys.address, FAILURE_WINDOW_MS, now)) >= FAILURES_PER_ADDRESS) {
    return `Too many failed sign-ins from your network. Try again in ${minutes} minutes.`;
  }
  return null;
}

async function countFailure(deps: AppDeps, email: string, ip: string): Promise<void> {
  const now = nowOf(deps);
  const keys = failureKeys(email, ip);
  await deps.rateLimiter.hit(keys.pair, FAILURES_PER_ACCOUNT_ADDRESS, FAILURE_WINDOW_MS, now);
  await deps.rateLimiter.hit(keys.address, FAILURES_PER_ADDRESS, FAILURE_WINDOW_MS, now);
}

/** Email, password, business name, CSRF token and `next`: a few hundred bytes filled in. */
export const CREDENTIALS_FORM_LIMIT = 4 * 1024;

export function registerSignInRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get('/dashboard/sign-in', async (request, reply) => {
    if (await loadSession(deps, request)) return reply.redirect(safeNextPath((request.query as Form).next));
    return credentialsPage(request, reply, deps, 'sign-in');
  });

  app.post('/dashboard/sign-in', { bodyLimit: CREDENTIALS_FORM_LIMIT }, async (request, reply) => {
    assertCsrf(request);
    const form = formOf(request);
    const email = normalizedEmail(form.email ?? '');
    const refusal = await refusalOf(deps, email, request.ip);
    if (refusal) return credentialsPage(request, reply, deps, 'sign-in', { error: refusal, email, status: 429 });
    const merchant = email ? await findMerchantByEmail(deps.storage, email) : undefined;
    const valid = await verifyPassword(form.password ?? '', merchant?.password_hash ?? null);
    if (!merchant || !valid) {
      await countFailure(deps, email, request.ip);
      return credentialsPage(request, reply, deps, 'sign-in', { error: 'Wrong email or password.', email, status: 401 });
    }
    await deps.rateLimiter.clear(failureKeys(email, request.ip).pair, FAILURE_WINDOW_MS, nowOf(deps));
    await startSession(deps, request, reply, merchant.id);
    return reply.redirect(safeNextPath(form.next), 303);
  });

  app.get('/dashboard/sign-up', async (request, reply) => {
    if (!deps.config.dashboardSignup) return signUpClosed(reply);
    return credentialsPage(request, reply, deps, 'sign-up');
  });

  app.post('/dashboard/sign-up', { bodyLimit: CREDENTIALS_FORM_LIMIT }, async (request, reply) => {
    if (!deps.config.dashboardSignup) return signUpClosed(reply);
    assertCsrf(request);
    const form = formOf(request);
    const email = normalizedEmail(form.email ?? '');
    const name = (form.name ?? '').trim();
    const password = form.password ?? '';
    const problem = !name
      ? 'Enter a business name.'
      : !isValidEmail(email)
        ? 'Enter a valid email address.'
        : password.length < MIN_PASSWORD_LENGTH
          ? `Choose a password of at least ${MIN_PASSWORD_LENGTH} characters.`
          : null;
    if (problem) return credentialsPage(request, reply, deps, 'sign-up', { error: problem, email, status: 400 });
    const created = await createMerchant(deps.storage, { name, email, password }, nowIsoOf(deps)).catch((e: unknown) => {
      if (isUniqueViolation(e)) return null;
      throw e;
    });
    if (!created) {
      return credentialsPage(request, reply, deps, 'sign-up', { error: 'An account with this email already exists.', email, status: 409 });
    }
    await startSession(deps, request, reply, created.merchant.id);
    return reply.redirect('/dashboard', 303);
  });

  app.post('/dashboard/sign-out', { bodyLimit: CREDENTIALS_FORM_LIMIT }, async (request, reply) => {
    await loadSession(deps, request);
    assertCsrf(request);
    await endSession(deps, request, reply);
    return reply.redirect('/dashboard/sign-in', 303);
  });
}

function signUpClosed(reply: FastifyReply): FastifyReply {
  return sendPage(reply, {
    title: 'Sign-up closed',
    status: 404,
    main: html`<div class="card narrow"><h1>Sign-up is closed</h1>
<p>This Tollgate's operator creates merchant accounts. Ask them for one, or <a href="/dashboard/sign-in">sign in</a>.</p></div>`,
  });
}
