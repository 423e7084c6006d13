import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { nowOf } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { checkPasswordReset, redeemPasswordReset, type ResetRedemption } from '../storage/password-resets.ts';
import { html } from './html.ts';
import { sendPage } from './layout.ts';
import { newPasswordInputs, newPasswordProblem, type PasswordProblem } from './password-form.ts';
import { assertCsrf, csrfTokenFor } from './session.ts';
import { CREDENTIALS_FORM_LIMIT } from './sign-in.ts';

type Form = Record<string, string | undefined>;

const UNUSABLE: Record<Exclude<ResetRedemption['outcome'], 'ok'>, string> = {
  unknown: 'This reset link is not valid. Check that it was copied whole, or ask your operator for a new one.',
  used: 'This reset link was already used. Ask your operator for a new one if you still need it.',
  expired: 'This reset link has expired. Ask your operator for a new one.',
};

const tokenOf = (source: unknown): string => {
  const token = (source as Form | undefined)?.token;
  return typeof token === 'string' && token.length <= 200 ? token : '';
};

/** The page a one-time reset link (issued by `tollgate admin reset-link`) opens: choose a new password. */
export function registerPasswordResetRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get('/dashboard/reset-password', async (request, reply) => {
    const token = tokenOf(request.query);
    const checked = await checkPasswordReset(deps.storage, token, nowOf(deps));
    if (checked.outcome !== 'ok') return unusablePage(reply, checked.outcome);
    return resetForm(request, reply, token);
  });

  app.post('/dashboard/reset-password', { bodyLimit: CREDENTIALS_FORM_LIMIT }, async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Form;
    const token = tokenOf(form);
    const problem = newPasswordProblem(form);
    if (problem) {
      const checked = await checkPasswordReset(deps.storage, token, nowOf(deps));
      if (checked.outcome !== 'ok') return unusablePage(reply, checked.outcome);
      return resetForm(request, reply, token, problem);
    }
    const redeemed = await redeemPasswordReset(deps.storage, token, form.new_password!, nowOf(deps));
    if (redeemed.outcome !== 'ok') return unusablePage(reply, redeemed.outcome);
    return sendPage(reply, {
      title: 'Password set',
      main: html`<div class="card narrow"><h1>Password set</h1>
<p role="status">Your new password is in place, and every browser that was signed in to this account was signed out.</p>
<p><a class="button" href="/dashboard/sign-in">Sign in</a></p></div>`,
    });
  });
}

function resetForm(request: FastifyRequest, reply: FastifyReply, token: string, problem?: PasswordProblem): FastifyReply {
  return sendPage(reply, {
    title: 'Choose a new password',
    status: problem ? 400 : 200,
    main: html`<div class="card narrow"><h1>Choose a new password</h1>
${problem ? html`<p class="error" role="alert">The password was not set.</p>` : ''}
<form method="post" action="/dashboard/reset-password">
<input type="hidden" name="_csrf" value="${csrfTokenFor(request, reply)}">
<input type="hidden" name="token" value="${token}">
${newPasswordInputs(problem)}
<button type="submit">Set password</button>
</form></div>`,
  });
}

function unusablePage(reply: FastifyReply, outcome: Exclude<ResetRedemption['outcome'], 'ok'>): FastifyReply {
  return sendPage(reply, {
    title: 'Reset link not usable',
    status: outcome === 'unknown' ? 404 : 410,
    main: html`<div class="card narrow"><h1>This reset link cannot be used</h1>
<p role="alert">${UNUSABLE[outcome]}</p><p><a href="/dashboard/sign-in">Sign in</a></p></div>`,
  });
}
