import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { nowOf } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { createCliCode } from '../storage/cli-codes.ts';
import { findMerchant } from '../storage/merchants.ts';
import { html } from './html.ts';
import { sendPage } from './layout.ts';
import { assertCsrf, csrfTokenFor, loadSession, WebError } from './session.ts';
import { CREDENTIALS_FORM_LIMIT } from './sign-in.ts';

type ConnectParams = { state: string; port: number };

/** `state` is the CLI's own nonce (32 hex from the published client); the port is its listener's. */
function connectParams(source: unknown): ConnectParams {
  const { state, port } = (source ?? {}) as Record<string, unknown>;
  const portNumber = typeof port === 'string' && /^\d{1,5}$/.test(port) ? Number(port) : NaN;
  if (typeof state !== 'string' || !/^[A-Za-z0-9_-]{8,128}$/.test(state) || !(portNumber >= 1024 && portNumber <= 65535)) {
    throw new WebError(400, 'This authorization link is incomplete or damaged. Run the login command again.');
  }
  return { state, port: portNumber };
}

/** The CLI listens on loopback only; the code never travels anywhere else. */
const callbackOrigin = (port: number) => `http://127.0.0.1:${port}`;

/**
 * The browser half of the CLI login: a signed-in merchant sees what the command asks for and
 * approves; the approval mints a one-time code and hands it to the CLI's loopback listener.
 */
export function registerCliConnectRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get('/auth/connect', async (request, reply) => {
    const params = connectParams(request.query);
    const session = await loadSession(deps, request);
    if (!session) return reply.redirect(`/dashboard/sign-in?next=${encodeURIComponent(request.url)}`);
    const merchant = await findMerchant(deps.storage, session.merchantId);
    return approvalPage(request, reply, params, merchant?.name ?? session.merchantId);
  });

  app.post('/auth/connect', { bodyLimit: CREDENTIALS_FORM_LIMIT }, async (request, reply) => {
    const session = await loadSession(deps, request);
    if (!session) throw new WebError(401, 'Your session ended. Sign in and run the login command again.');
    assertCsrf(request);
    const params = connectParams(request.body);
    const target = new URL('/callback', callbackOrigin(params.port));
    // Refusing tells the waiting command at once (the OAuth way, error=access_denied); nothing is minted.
    if ((request.body as Record<string, unknown>).decision === 'deny') target.searchParams.set('error', 'access_denied');
    else target.searchParams.set('code', await createCliCode(deps.storage, session.merchantId, nowOf(deps)));
    target.searchParams.set('state', params.state);
    // The page's form-action lists the listener, so the browser follows this redirect.
    return reply.headers({ 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' }).redirect(target.toString(), 303);
  });
}

function approvalPage(request: FastifyRequest, reply: FastifyReply, params: ConnectParams, merchantName: string): FastifyReply {
  return sendPage(reply, {
    title: 'Authorize command-line access',
    formTargets: [callbackOrigin(params.port)],
    main: html`<div class="card narrow">
<h1>Authorize command-line access</h1>
<p>A command-line tool on this computer (listening on port ${params.port}) asks for a <strong>new secret key</strong> for
<strong>${merchantName}</strong>. It can then do everything your API keys can: read usage, create meters and customers, grant credit.</p>
<p>Approve only if you just ran a login command yourself. You can revoke the key later under Secret keys.</p>
<form method="post" action="/auth/connect">
<input type="hidden" name="_csrf" value="${csrfTokenFor(request, reply)}">
<input type="hidden" name="state" value="${params.state}">
<input type="hidden" name="port" value="${params.port}">
<button type="submit" name="decision" value="approve">Approve</button>
<button class="secondary" type="submit" name="decision" value="deny">Cancel</button>
</form>
</div>`,
  });
}
