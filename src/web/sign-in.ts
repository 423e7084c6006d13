import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { isValidEmail } from '../domain/email.ts';
import { nowOf, type AppDeps } from '../http/types.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { createMerchant, findMerchantByEmail, normalizedEmail, verifyPassword } from '../storage/merchants.ts';
import { html } from './html.ts';
import { sendPage } from './layout.ts';
import { assertCsrf, csrfTokenFor, endSession, loadSession, safeNextPath, startSession } from './session.ts';

/** Sign-in attempts allowed per window, per account and per client address. */
const ATTEMPTS_PER_ACCOUNT = 5;
const ATTEMPTS_PER_ADDRESS = 20;
const ATTEMPT_WINDOW_MS = 15 * 60_000;
const MIN_PASSWORD_LENGTH = 10;

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

/** Counts this attempt against the account and the address; the refusal message if either is spent. */
async function lockoutOf(deps: AppDeps, email: string, ip: string): Promise<string | null> {
  const now = nowOf(deps);
  const account = await deps.rateLimiter.hit(`sign-in:account:${email}`, ATTEMPTS_PER_ACCOUNT, ATTEMPT_WINDOW_MS, now);
  const address = await deps.rateLimiter.hit(`sign-in:address:${ip}`, ATTEMPTS_PER_ADDRESS, ATTEMPT_WINDOW_MS, now);
  const minutes = (resetAt: number) => Math.max(1, Math.ceil((resetAt * 1000 - now) / 60_000));
  if (!account.allowed) {
    return `This account is locked after too many sign-in attempts. Try again in ${minutes(account.resetAt)} minutes.`;
  }
  if (!address.allowed) return `Too many sign-in attempts from your network. Try again in ${minutes(address.resetAt)} minutes.`;
  return null;
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
    const lockout = await lockoutOf(deps, email, request.ip);
    if (lockout) return credentialsPage(request, reply, deps, 'sign-in', { error: lockout, email, status: 429 });
    const merchant = email ? await findMerchantByEmail(deps.storage, email) : undefined;
    const valid = await verifyPassword(form.password ?? '', merchant?.password_hash ?? null);
    if (!merchant || !valid) {
      return credentialsPage(request, reply, deps, 'sign-in', { error: 'Wrong email or password.', email, status: 401 });
    }
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
    const created = await createMerchant(deps.storage, { name, email, password }).catch((e: unknown) => {
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
