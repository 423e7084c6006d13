import { principalOf } from '../http/auth.ts';
import { pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, errorResponse, idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  createdSecretKeySchema,
  createSecretKey,
  listSecretKeyPage,
  presentSecretKey,
  revokeKey,
  rotateKeySecret,
  secretKeyCreateBody,
  secretKeySchema,
} from '../services/secret-keys.ts';

const tags = ['secret keys'];

export function registerSecretKeyRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  app.get(
    '/secret_keys',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(secretKeySchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      return toPage(await listSecretKeyPage(storage, principalOf(request).merchantId, cursor, limit), limit, presentSecretKey);
    },
  );

  app.post(
    '/secret_keys',
    { schema: { tags, body: secretKeyCreateBody, response: { 201: createdSecretKeySchema, ...standardErrors } } },
    async (request, reply) => {
      const { row, secret } = await createSecretKey(deps, principalOf(request).merchantId, request.body);
      return reply.status(201).send({ ...presentSecretKey(row), secret_key: secret });
    },
  );

  app.post(
    '/secret_keys/:id/rotate',
    {
      schema: {
        tags,
        summary: 'Give a secret key a new secret',
        description: 'The key keeps its id and name; its old secret is refused from now on. The new secret is shown only in this answer.',
        params: idParams,
        response: { 200: createdSecretKeySchema, ...standardErrors },
      },
    },
    async (request) => {
      const { row, secret } = await rotateKeySecret(storage, principalOf(request).merchantId, request.params.id);
      return { ...presentSecretKey(row), secret_key: secret };
    },
  );

  app.delete(
    '/secret_keys/:id',
    {
      schema: {
        tags,
        params: idParams,
        response: { 200: deletedResponse, ...standardErrors, 409: errorResponse('`last_secret_key`: the last key cannot be deleted') },
      },
    },
    async (request) => {
      await revokeKey(deps, principalOf(request).merchantId, request.params.id);
      return { id: request.params.id, deleted: true as const };
    },
  );
}
