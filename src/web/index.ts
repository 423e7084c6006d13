import fastifyCookie from '@fastify/cookie';
import fastifyFormbody from '@fastify/formbody';
import type { FastifyInstance } from 'fastify';
import { nowIsoOf } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { serverSecret } from '../storage/sessions.ts';
import { registerAssetRoutes } from './assets.ts';
import { registerCliConnectRoutes } from './cli-connect.ts';
import { registerDashboardRoutes } from './dashboard/index.ts';
import { html } from './html.ts';
import { sendPage } from './layout.ts';
import { registerPasswordResetRoutes } from './password-reset.ts';
import { registerSignInRoutes } from './sign-in.ts';
import { sendDashboardPage } from './dashboard/shell.ts';
import { loadSession, WebError } from './session.ts';

/** The largest dashboard form (a plan with its description, a webhook's settings). */
const FORM_BODY_LIMIT = 64 * 1024;

/**
 * Every HTML page and its assets: dashboard, sign-in, CLI authorization. Errors here are pages,
 * not JSON envelopes; forms are URL-encoded and carry a CSRF token.
 */
export async function registerWebRoutes(app: FastifyInstance, deps: AppDeps): Promise<void> {
  const cookieSecret = await serverSecret(deps.storage, 'cookie_signing', nowIsoOf(deps));
  await app.register(async (web) => {
    // Pages are not API operations: none of them belongs in the OpenAPI document.
    // Pages take URL-encoded forms and nothing else: any other body is refused (415) unread, and
    // each route reads at most its own limit (the sign-in forms a few KB), not the API's 10 MiB.
    web.addHook('onRoute', (route) => {
      route.schema = { ...route.schema, hide: true };
      route.bodyLimit ??= FORM_BODY_LIMIT;
    });
    web.removeAllContentTypeParsers();
    await web.register(fastifyCookie, { secret: cookieSecret });
    await web.register(fastifyFormbody, { bodyLimit: FORM_BODY_LIMIT });
    web.setErrorHandler(async (error, request, reply) => {
      const status = error instanceof WebError ? error.status : (error as { statusCode?: number }).statusCode ?? 500;
      if (status >= 500) request.log.error({ err: error }, 'page failed');
      const message = status >= 500 || !(error instanceof WebError) ? pageErrorMessage(status) : error.message;
      const title = status >= 500 ? 'Something went wrong' : status === 404 ? 'Not found' : 'Request refused';
      const main = html`<div class="card narrow"><h1>${title}</h1>
<p role="alert">${message}</p><p><a href="/dashboard">Back to the dashboard</a></p></div>`;
      // A signed-in merchant keeps the navigation, with the section the missing page belongs to marked.
      const session = status < 500 ? await loadSession(deps, request).catch(() => null) : null;
      if (session) return sendDashboardPage(request, reply, sectionOf(request.url), { title, status, main });
      return sendPage(reply, { title, status, main });
    });
    web.get('/', async (_request, reply) => reply.redirect('/dashboard'));
    registerAssetRoutes(web);
    registerSignInRoutes(web, deps);
    registerPasswordResetRoutes(web, deps);
    registerCliConnectRoutes(web, deps);
    registerDashboardRoutes(web, deps);
    // Any other dashboard address is a page that does not exist: a page says so, not a JSON envelope.
    web.get('/dashboard/*', async () => {
      throw new WebError(404, 'There is no such page in the dashboard.');
    });
  });
}

/** `/dashboard/customers/con_x?y` belongs to `/dashboard/customers`. */
function sectionOf(url: string): string {
  return /^\/dashboard(\/[^/?#]+)?/.exec(url)?.[0] ?? '';
}

function pageErrorMessage(status: number): string {
  if (status === 413) return 'The form is too large.';
  if (status === 415) return 'Forms must be sent URL-encoded.';
  if (status < 500) return 'The request could not be understood. Reload the page and try again.';
  return 'The page could not be shown. Try again in a moment.';
}
