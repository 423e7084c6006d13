/**
 * Wallet keys: a wallet owner's credential (`wk_live_…`) that manages that wallet's spend keys and
 * nothing else. Created, listed, revoked and rotated with the merchant's secret key only.
 */
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SECRET_PREFIX } from '../domain/ids.ts';
import { hashesEqual, hashSecret } from '../domain/secrets.ts';
import { authenticateSecretKey, bearerToken, principalOf, type Principal } from '../http/auth.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { idParams, optionalBody, standardErrors, successResponse } from '../http/schemas.ts';
import type { App, AppDeps } from '../http/types.ts';
import type { Storage } from '../storage/db.ts';
import {
  findActiveWalletKeyByHash,
  insertWalletKey,
  listWalletKeys,
  markWalletKeyUsed,
  revokeWalletKey,
  rotateWalletKey,
  walletKeyIdExists,
  type WalletKeyRow,
  type WalletRef,
} from '../storage/wallet-keys.ts';
import { walletForNewKey } from './spend-keys.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set when the caller authenticated with a wallet key: the only wallet it may act on. */
    walletKeyScope?: WalletRef;
  }
  interface FastifyContextConfig {
    /** Routes a wallet key may call (its wallet's spend keys); every other route refuses it. */
    walletKeyAllowed?: boolean;
  }
}

/**
 * Authenticates the bearer key of a standard endpoint: a merchant secret key, or a wallet key on
 * the routes that admit one (403 `forbidden` elsewhere).
 */
export async function authenticateApiKey(storage: Storage, request: FastifyRequest): Promise<Principal> {
  const token = bearerToken(request);
  if (token === null || !token.startsWith(SECRET_PREFIX.walletKey)) return authenticateSecretKey(storage, token);
  const hash = hashSecret(token);
  const row = await findActiveWalletKeyByHash(storage, hash);
  if (!row || !hashesEqual(row.key_hash, hash)) throw new ApiError('unauthorized', 'Invalid or revoked wallet key.');
  if (!request.routeOptions.config.walletKeyAllowed) {
    throw new ApiError('forbidden', "A wallet key may only manage its own wallet's spend keys.");
  }
  await markWalletKeyUsed(storage, row.id);
  request.walletKeyScope = { walletId: row.wallet_id, connectionId: row.connection_id };
  return {
    merchantId: row.merchant_id,
    merchantWalletId: row.merchant_wallet_id,
    serviceChargeRate: row.service_charge_rate === null ? null : BigInt(row.service_charge_rate),
    keyId: row.id,
  };
}

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
    customer_id: z.string().min(1).max(100).optional(),
    connection_id: z.string().min(1).max(100).optional(),
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

export function registerWalletKeyRoutes(app: App, { storage }: AppDeps): void {
  app.get(
    '/wallet_keys',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(walletKeySchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (id) => walletKeyIdExists(storage, merchantId, id));
      return toPage(await listWalletKeys(storage, merchantId, cursor, limit), limit, present);
    },
  );

  app.post(
    '/wallet_keys',
    { schema: { tags, body: createBody, response: { 201: withKey, ...standardErrors } } },
    async (request, reply) => {
      const { name, ...walletFields } = request.body;
      const wallet = await walletForNewKey(storage, request, walletFields);
      const { row, secret } = await insertWalletKey(storage.db, { merchantId: principalOf(request).merchantId, wallet, name });
      return reply.status(201).send({ ...present(row), key: secret });
    },
  );

  app.delete(
    '/wallet_keys/:id',
    { schema: { tags, params: idParams, response: { 200: successResponse, ...standardErrors } } },
    async (request) => {
      if (!(await revokeWalletKey(storage, principalOf(request).merchantId, request.params.id))) {
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
