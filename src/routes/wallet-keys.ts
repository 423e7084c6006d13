/**
 * Wallet keys: a wallet owner's credential (`wk_live_…`) that manages that wallet's spend keys and
 * nothing else. Created, listed, revoked and rotated with the merchant's secret key only.
 */
import { z } from 'zod';
import { principalOf } from '../http/auth.ts';
import { notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { customerRef, idParams, optionalBody, standardErrors, successResponse } from '../http/schemas.ts';
import { nowIsoOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  insertWalletKey,
  listWalletKeys,
  revokeWalletKey,
  rotateWalletKey,
  type WalletKeyRow,
} from '../storage/wallet-keys.ts';
import { walletForNewKey } from '../services/spend-keys.ts';
import { merchantHasRow } from '../storage/pages.ts';

const walletKeySchema = z.object({
  wallet_key_id: z.string(),
  key_preview: z.string(),
  name: z.string(),
  wallet_id: z.string(),
  customer_id: z.string().nullable(),
  created_at: z.string(),
  last_used_at: z.string().nullable(),
});
const withKey = walletKeySchema.extend({ key: z.string().describe('The raw wallet key, shown only once') });
const createBody = optionalBody(
  z.strictObject({
    name: z.string().trim().min(1).max(255).default('Wallet key'),
    customer_id: customerRef.optional().describe('The customer id, or its reference_id'),
    connection_id: customerRef.optional(),
    wallet_id: z.string().min(1).max(100).optional(),
  }),
);

const tags = ['wallet keys'];

function present(row: WalletKeyRow): z.infer<typeof walletKeySchema> {
  return {
    wallet_key_id: row.id,
    key_preview: row.key_preview,
    name: row.name,
    wallet_id: row.wallet_id,
    customer_id: row.connection_id,
    created_at: row.created_at,
    last_used_at: row.last_used_at,
  };
}

export function registerWalletKeyRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  app.get(
    '/wallet_keys',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(walletKeySchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'wallet_keys', merchantId, id));
      return toPage(await listWalletKeys(storage, merchantId, cursor, limit), limit, present);
    },
  );

  app.post(
    '/wallet_keys',
    { schema: { tags, body: createBody, response: { 201: withKey, ...standardErrors } } },
    async (request, reply) => {
      const { name, ...walletFields } = request.body;
      const { merchantId, merchantWalletId } = principalOf(request);
      const wallet = await walletForNewKey(storage, { merchantId, merchantWalletId, walletKeyScope: request.walletKeyScope }, walletFields);
      const { row, secret } = await insertWalletKey(storage.db, { merchantId, wallet, name, at: nowIsoOf(deps) });
      return reply.status(201).send({ ...present(row), key: secret });
    },
  );

  app.delete(
    '/wallet_keys/:id',
    { schema: { tags, params: idParams, response: { 200: successResponse, ...standardErrors } } },
    async (request) => {
      if (!(await revokeWalletKey(storage, principalOf(request).merchantId, request.params.id, nowIsoOf(deps)))) {
        throw notFound('wallet key', request.params.id);
      }
      return { success: true as const };
    },
  );

  app.post(
    '/wallet_keys/:id/rotate',
    { schema: { tags, params: idParams, response: { 200: withKey, ...standardErrors } } },
    async (request) => {
      const rotated = await rotateWalletKey(storage, principalOf(request).merchantId, request.params.id);
      if (!rotated) throw notFound('wallet key', request.params.id);
      return { ...present(rotated.row), key: rotated.secret };
    },
  );
}
