import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { nowIsoOf } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import { insertSecretKey, listSecretKeys, revokeSecretKey } from '../../storage/secret-keys.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { csrfField, merchantOf, sendDashboardPage } from './shell.ts';

const LIST_LIMIT = 100;
const REVOKE_MESSAGES = {
  revoked: 'Key revoked.',
  not_found: 'No such key.',
  last_key: 'This is your last secret key; create another before revoking it.',
} as const;

export function registerSecretKeyPages(app: FastifyInstance, deps: AppDeps): void {
  const page = async (
    request: FastifyRequest,
    reply: FastifyReply,
    flash: { created?: string; message?: string; status?: number } = {},
  ) => {
    const keys = await listSecretKeys(deps.storage, merchantOf(request), undefined, LIST_LIMIT);
    return sendDashboardPage(request, reply, '/dashboard/secret-keys', {
      title: 'Secret keys',
      status: flash.status,
      main: html`<h1>Secret keys</h1>
${flash.created ? html`<div class="card notice" role="status"><p><strong>Copy this key now; it is not shown again.</strong></p>
<p class="secret" id="new-secret-key">${flash.created}</p></div>` : ''}
${flash.message ? html`<p role="status">${flash.message}</p>` : ''}
<form class="card" method="post" action="/dashboard/secret-keys">
${csrfField(request, reply)}
<label for="key-name">Name</label><input id="key-name" name="name" maxlength="255" value="Secret key" required>
<button type="submit">Create secret key</button>
</form>
<div class="card table-wrap" tabindex="0" role="region" aria-label="Secret keys"><table>
<caption class="visually-hidden">Active secret keys</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Key</th><th scope="col">Created</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>
${keys.slice(0, LIST_LIMIT).map(
  (k) => html`<tr><td>${k.name}</td><td><code>${k.key_hint}</code></td><td>${k.created_at.slice(0, 16).replace('T', ' ')}</td>
<td class="actions">${confirmLink(`/dashboard/secret-keys/${k.id}/revoke`, 'Revoke', `Revoke ${k.name} (${k.key_hint})`, true)}</td></tr>`,
)}
</tbody></table></div>`,
    });
  };

  app.get('/dashboard/secret-keys', (request, reply) => page(request, reply));

  app.post('/dashboard/secret-keys', async (request, reply) => {
    assertCsrf(request);
    const name = String((request.body as Record<string, unknown>).name ?? '').trim().slice(0, 255) || 'Secret key';
    const { secret } = await insertSecretKey(deps.storage.db, merchantOf(request), name, nowIsoOf(deps));
    return page(request, reply, { created: secret, status: 201 });
  });

  app.get<{ Params: { id: string } }>('/dashboard/secret-keys/:id/revoke', async (request, reply) => {
    const keys = await listSecretKeys(deps.storage, merchantOf(request), undefined, LIST_LIMIT);
    const key = keys.find((k) => k.id === request.params.id);
    if (!key) throw new WebError(404, `No secret key with id ${request.params.id}.`);
    return sendConfirmPage(request, reply, '/dashboard/secret-keys', {
      question: `Revoke the secret key ${key.name}?`,
      consequence: html`<code>${key.key_hint}</code> stops working at once and for good: every API call made with it is refused. Create and deploy its replacement first.`,
      action: `/dashboard/secret-keys/${encodeURIComponent(key.id)}/revoke`,
      confirmLabel: 'Revoke the key',
      back: '/dashboard/secret-keys',
    });
  });

  app.post<{ Params: { id: string } }>('/dashboard/secret-keys/:id/revoke', async (request, reply) => {
    assertCsrf(request);
    const outcome = await revokeSecretKey(deps.storage, merchantOf(request), request.params.id, nowIsoOf(deps));
    return page(request, reply, { message: REVOKE_MESSAGES[outcome], status: outcome === 'revoked' ? 200 : 409 });
  });
}
