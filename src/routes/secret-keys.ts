import { z } from 'zod';
import { principalOf } from '../http/auth.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, errorResponse, idParams, optionalBody, standardErrors } from '../http/schemas.ts';
import { nowIsoOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  insertSecretKey,
  listSecretKeys,
  revokeSecretKey,
  type SecretKeyRow,
} from '../storage/secret-keys.ts';
import { merchantHasRow } from '../storage/pages.ts';

const secretKeySchema = z.object({
  secret_key_id: z.string(),
  name: z.string(),
  secret_key_hint: z.string(),
  created_at: z.string(),
});
const createdSecretKeySchema = secretKeySchema.extend({ secret_key: z.string().describe('Shown only once') });
const createBody = optionalBody(z.object({ name: z.string().trim().min(1).max(255).default('Secret key') }));

const tags = ['secret keys'];

function present(row: SecretKeyRow): z.infer<typeof secretKeySchema> {
  return { secret_key_id: row.id, name: row.name, secret_key_hint: row.key_hint, created_at: row.created_at };
}

export function registerSecretKeyRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  app.get(
    '/secret_keys',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(secretKeySchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'secret_keys', merchantId, id));
      return toPage(await listSecretKeys(storage, merchantId, cursor, limit), limit, present);
    },
  );

  app.post(
    '/secret_keys',
    { schema: { tags, body: createBody, response: { 201: createdSecretKeySchema, ...standardErrors } } },
    async (request, reply) => {
      const { merchantId } = principalOf(request);
      const { row, secret } = await insertSecretKey(storage.db, merchantId, request.body.name, nowIsoOf(deps));
      return reply.status(201).send({ ...present(row), secret_key: secret });
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
      const { merchantId } = principalOf(request);
      const outcome = await revokeSecretKey(storage, merchantId, request.params.id, nowIsoOf(deps));
      if (outcome === 'not_found') throw notFound('secret key', request.params.id);
      if (outcome === 'last_key') throw new ApiError('last_secret_key');
      return { id: request.params.id, deleted: true as const };
    },
  );
}
