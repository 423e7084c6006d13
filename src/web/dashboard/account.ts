import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { nowOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { findMerchant, setMerchantLogin, verifyPassword } from '../../storage/merchants.ts';
import { deleteMerchantSessions } from '../../storage/sessions.ts';
import { html } from '../html.ts';
import { newPasswordInputs, newPasswordProblem, passwordInput, type PasswordProblem } from '../password-form.ts';
import { assertCsrf, startSession } from '../session.ts';
import { CREDENTIALS_FORM_LIMIT } from '../sign-in.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

/** Wrong current passwords a signed-in session may try per window before the form refuses. */
const CURRENT_PASSWORD_FAILURES = 5;
const CURRENT_PASSWORD_WINDOW_MS = 15 * 60_000;

type Form = Record<string, string | undefined>;

/** The signed-in merchant's own account: who it is, and changing its password. */
export function registerAccountPages(app: FastifyInstance, deps: AppDeps): void {
  const page = async (request: FastifyRequest, reply: FastifyReply, flash: { problem?: PasswordProblem; done?: boolean; status?: number } = {}) => {
    const merchant = await findMerchant(deps.storage, merchantOf(request));
    return sendDashboardPage(request, reply, '/dashboard/account', {
      title: 'Account',
      status: flash.status,
      main: html`<h1>Account</h1>
<div class="card"><dl class="kv"><dt>Business</dt><dd>${merchant?.name ?? ''}</dd><dt>Sign-in email</dt><dd>${merchant?.email ?? ''}</dd>
<dt>Merchant id</dt><dd><code>${merchantOf(request)}</code></dd></dl></div>
<form class="card" method="post" action="/dashboard/account/password">
<h2>Change password</h2>
${flash.done ? html`<p role="status" id="password-changed">Password changed. Other browsers signed in to this account were signed out.</p>` : ''}
${flash.problem ? html`<p class="error" role="alert">The password was not changed.</p>` : ''}
${csrfField(request, reply)}
<input type="hidden" name="username" value="${merchant?.email ?? ''}" autocomplete="username">
${passwordInput('current_password', 'Current password', 'current-password', flash.problem)}
${newPasswordInputs(flash.problem)}
<button type="submit">Change password</button>
</form>`,
    });
  };

  app.get('/dashboard/account', (request, reply) => page(request, reply));

  app.post('/dashboard/account/password', { bodyLimit: CREDENTIALS_FORM_LIMIT }, async (request, reply) => {
    assertCsrf(request);
    const merchantId = merchantOf(request);
    const form = (request.body ?? {}) as Form;
    const now = nowOf(deps);
    const failuresKey = `account:current-password-failures:${merchantId}`;
    if ((await deps.rateLimiter.count(failuresKey, CURRENT_PASSWORD_WINDOW_MS, now)) >= CURRENT_PASSWORD_FAILURES) {
      const problem = { field: 'current_password', message: 'Too many wrong current passwords. Try again in 15 minutes.' };
      return page(request, reply, { problem, status: 429 });
    }
    const merchant = await findMerchant(deps.storage, merchantId);
    if (!(await verifyPassword(form.current_password ?? '', merchant?.password_hash ?? null))) {
      await deps.rateLimiter.hit(failuresKey, CURRENT_PASSWORD_FAILURES, CURRENT_PASSWORD_WINDOW_MS, now);
      return page(request, reply, { problem: { field: 'current_password', message: 'This is not your current password.' }, status: 400 });
    }
    const problem = newPasswordProblem(form);
    if (problem) return page(request, reply, { problem, status: 400 });
    await setMerchantLogin(deps.storage.db, merchantId, { password: form.new_password! });
    // Whoever else holds a session (a forgotten browser, someone who learned the old password) is out;
    // this browser gets a fresh session.
    await deleteMerchantSessions(deps.storage, merchantId);
    await startSession(deps, request, reply, merchantId);
    return page(request, reply, { done: true });
  });
}
