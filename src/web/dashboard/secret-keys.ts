import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../http/errors.ts';
import type { AppDeps } from '../../app-deps.ts';
import { createSecretKey, getSecretKey, listSecretKeyPage, presentSecretKey, revokeKey, rotateKeySecret, secretKeyCreateBody } from '../../services/secret-keys.ts';
import { fieldIssues } from '../form-issues.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { fieldMessage, invalidAttrs, type FieldErrors } from './fields.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;

type Flash = { created?: { name: string; secret: string; rotated: boolean }; message?: string; errors?: FieldErrors; name?: string; status?: number };

/**
 * Secret keys: create one (its key shown once), give one a new secret (rotate: the old one is
 * refused at once, the new one shown once) and revoke one, each through the same service
 * operation as the API. Rotate and revoke ask first.
 */
export function registerSecretKeyPages(app: FastifyInstance, deps: AppDeps): void {
  const page = async (request: FastifyRequest, reply: FastifyReply, flash: Flash = {}) => {
    const keys = (await listSecretKeyPage(deps.storage, merchantOf(request), undefined, LIST_LIMIT)).slice(0, LIST_LIMIT).map(presentSecretKey);
    const errors = flash.errors ?? {};
    return sendDashboardPage(request, reply, '/dashboard/secret-keys', {
      title: 'Secret keys',
      status: flash.status,
      main: html`<h1>Secret keys</h1>
${flash.created ? html`<div class="card notice" role="status"><p><strong>Copy the ${flash.created.rotated ? 'new secret' : 'key'} of “${flash.created.name}” now; it is not shown again.</strong>${flash.created.rotated ? ' The old secret no longer works.' : ''}</p>
<p class="secret" id="new-secret-key">${flash.created.secret}</p></div>` : ''}
${flash.message ? html`<p class="notice" role="status" id="secret-key-message">${flash.message}</p>` : ''}
<form class="card" method="post" action="/dashboard/secret-keys" novalidate>
${csrfField(request, reply)}
<h2>Create a secret key</h2>
<label for="key-name">Name</label><input id="key-name" name="name" maxlength="255" value="${flash.name ?? 'Secret key'}" required${invalidAttrs('key-name', errors.name)}>
${fieldMessage('key-name', errors.name)}
<button type="submit">Create secret key</button>
</form>
<div class="card table-wrap" tabindex="0" role="region" aria-label="Secret keys"><table id="secret-keys">
<caption class="visually-hidden">Active secret keys</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Key</th><th scope="col">Created (UTC)</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>
${keys.map(
  (k) => html`<tr id="key-${k.secret_key_id}"><th scope="row">${k.name}</th><td><code>${k.secret_key_hint}</code></td><td>${k.created_at.slice(0, 16).replace('T', ' ')}</td>
<td class="actions">${confirmLink(`/dashboard/secret-keys/${k.secret_key_id}/rotate`, 'Rotate', `Rotate ${k.name} (${k.secret_key_hint})`)} ${confirmLink(`/dashboard/secret-keys/${k.secret_key_id}/revoke`, 'Revoke', `Revoke ${k.name} (${k.secret_key_hint})`, true)}</td></tr>`,
)}
</tbody></table></div>`,
    });
  };

  /** The merchant's active key of the URL, or the dashboard's 404 page. */
  const keyOf = async (request: FastifyRequest<{ Params: { id: string } }>) => {
    try {
      return presentSecretKey(await getSecretKey(deps.storage, merchantOf(request), request.params.id));
    } catch (e) {
      if (e instanceof ApiError && e.code === 'not_found') throw new WebError(404, `No active secret key with id ${request.params.id}.`);
      throw e;
    }
  };

  app.get<{ Querystring: { revoked?: string } }>('/dashboard/secret-keys', (request, reply) =>
    page(request, reply, request.query.revoked ? { message: 'Key revoked: calls made with it are refused.' } : {}),
  );

  app.post('/dashboard/secret-keys', async (request, reply) => {
    assertCsrf(request);
    const form = (request.body ?? {}) as Record<string, string>;
    const parsed = secretKeyCreateBody.safeParse({ name: form.name ?? '' });
    if (!parsed.success) return page(request, reply, { errors: fieldIssues(parsed.error.issues, { name: 'Name' }), name: form.name, status: 400 });
    const { row, secret } = await createSecretKey(deps, merchantOf(request), parsed.data);
    return page(request, reply, { created: { name: row.name, secret, rotated: false }, status: 201 });
  });

  app.get<{ Params: { id: string } }>('/dashboard/secret-keys/:id/rotate', async (request, reply) => {
    const key = await keyOf(request);
    return sendConfirmPage(request, reply, '/dashboard/secret-keys', {
      question: `Rotate the secret key ${key.name}?`,
      consequence: html`<code>${key.secret_key_hint}</code> gets a new secret, shown once on the next page. The current secret is refused from that moment: have the place that uses it ready for the new one.`,
      action: `/dashboard/secret-keys/${encodeURIComponent(key.secret_key_id)}/rotate`,
      confirmLabel: 'Rotate the key',
      back: '/dashboard/secret-keys',
    });
  });

  app.post<{ Params: { id: string } }>('/dashboard/secret-keys/:id/rotate', async (request, reply) => {
    assertCsrf(request);
    await keyOf(request);
    const { row, secret } = await rotateKeySecret(deps.storage, merchantOf(request), request.params.id);
    return page(request, reply, { created: { name: row.name, secret, rotated: true } });
  });

  app.get<{ Params: { id: string } }>('/dashboard/secret-keys/:id/revoke', async (request, reply) => {
    const key = await keyOf(request);
    return sendConfirmPage(request, reply, '/dashboard/secret-keys', {
      question: `Revoke the secret key ${key.name}?`,
      consequence: html`<code>${key.secret_key_hint}</code> stops working at once and for good: every API call made with it is refused. Create and deploy its replacement first.`,
      action: `/dashboard/secret-keys/${encodeURIComponent(key.secret_key_id)}/revoke`,
      confirmLabel: 'Revoke the key',
      back: '/dashboard/secret-keys',
    });
  });

  app.post<{ Params: { id: string } }>('/dashboard/secret-keys/:id/revoke', async (request, reply) => {
    assertCsrf(request);
    try {
      await revokeKey(deps, merchantOf(request), request.params.id);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.code === 'last_secret_key') return page(request, reply, { message: 'This is your last secret key; create another before revoking it.', status: 409 });
      throw new WebError(404, `No active secret key with id ${request.params.id}.`);
    }
    return reply.redirect('/dashboard/secret-keys?revoked=1', 303);
  });
}
