/**
 * Spend key management at /v1/spend_keys and, with the same handlers, /v1/manage/spend_keys.
 * Authenticated by the merchant's secret key (every wallet of the merchant) or by a wallet key
 * (only the spend keys of that key's wallet). The raw key is returned on create and rotate only.
 */
import type { FastifyRequest } from 'fastify';
import { principalOf } from '../http/auth.ts';
import { pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { idParams, standardErrors, successResponse } from '../http/schemas.ts';
import { nowOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  changeSpendKey,
  createSpendKey,
  deleteSpendKey,
  getSpendKey,
  listSpendKeyPage,
  presentSpendKey,
  rotateSpendKeySecret,
  spendKeyCreateBody,
  spendKeySchema,
  spendKeyUpdateBody,
  spendKeyWithSecret,
  type SpendKeyCaller,
} from '../services/spend-keys.ts';
import type { SpendKeyScope } from '../storage/spend-keys.ts';

const tags = ['spend keys'];

/** What the caller may see: the merchant's keys, or only its wallet's with a wallet key. */
export function scopeOf(request: FastifyRequest): SpendKeyScope {
  return { merchantId: principalOf(request).merchantId, walletId: request.walletKeyScope?.walletId ?? null };
}

/** The merchant and, with a wallet key, the one wallet it may act on. */
export function callerOf(request: FastifyRequest): SpendKeyCaller {
  const { merchantId, merchantWalletId } = principalOf(request);
  return { merchantId, merchantWalletId, walletKeyScope: request.walletKeyScope };
}

export function registerSpendKeyRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  const now = () => new Date(nowOf(deps));
  for (const base of ['/spend_keys', '/manage/spend_keys']) {
    const config = { walletKeyAllowed: true };
    app.get(
      base,
      { config, schema: { tags, querystring: pageQuery, response: { 200: pageResponse(spendKeySchema), ...standardErrors } } },
      async (request) => {
        const { cursor, limit } = request.query;
        const rows = await listSpendKeyPage(storage, scopeOf(request), cursor, limit);
        const at = now();
        return toPage(rows, limit, (row) => presentSpendKey(row, at));
      },
    );

    app.post(
      base,
      { config, schema: { tags, body: spendKeyCreateBody, response: { 201: spendKeyWithSecret, ...standardErrors } } },
      async (request, reply) => {
        const at = now();
        const { row, secret } = await createSpendKey(storage, callerOf(request), request.body, at);
        return reply.status(201).send({ ...presentSpendKey(row, at), key: secret });
      },
    );

    app.get(
      `${base}/:id`,
      { config, schema: { tags, params: idParams, response: { 200: spendKeySchema, ...standardErrors } } },
      async (request) => presentSpendKey(await getSpendKey(storage, scopeOf(request), request.params.id), now()),
    );

    for (const method of ['PUT', 'PATCH'] as const) {
      app.route({
        method,
        url: `${base}/:id`,
        config,
        schema: { tags, params: idParams, body: spendKeyUpdateBody, response: { 200: spendKeySchema, ...standardErrors } },
        handler: async (request) => {
          const at = now();
          return presentSpendKey(await changeSpendKey(storage, scopeOf(request), request.params.id, request.body, at), at);
        },
      });
    }

    app.delete(
      `${base}/:id`,
      { config, schema: { tags, params: idParams, response: { 200: successResponse, ...standardErrors } } },
      async (request) => {
        await deleteSpendKey(storage, scopeOf(request), request.params.id, now());
        return { success: true as const };
      },
    );

    app.post(
      `${base}/:id/rotate`,
      { config, schema: { tags, params: idParams, response: { 200: spendKeyWithSecret, ...standardErrors } } },
      async (request) => {
        const rotated = await rotateSpendKeySecret(storage, scopeOf(request), request.params.id);
        return { ...presentSpendKey(rotated.row, now()), key: rotated.secret };
      },
    );
  }
}
