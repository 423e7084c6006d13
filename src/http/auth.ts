import type { FastifyRequest } from 'fastify';
import { SECRET_PREFIX } from '../domain/ids.ts';
import { hashSecret, hashesEqual } from '../domain/secrets.ts';
import type { Storage } from '../storage/db.ts';
import { coalesced, type Coalesced } from '../storage/coalesce.ts';
import { findActiveKeysByHash, type ActiveKeyRow } from '../storage/secret-keys.ts';
import { findActiveWalletKeyByHash, markWalletKeyUsed, type ActiveWalletKeyRow, type WalletRef } from '../storage/wallet-keys.ts';
import { ApiError } from './errors.ts';
import { dateOf, type Clock } from '../domain/clock.ts';

export type Principal = {
  merchantId: string;
  merchantWalletId: string;
  /** The merchant's own service-charge rate (percent, 1e-10 units); null = operator default. */
  serviceChargeRate: bigint | null;
  /** The secret key's id: scopes rate limits and idempotency keys. */
  keyId: string;
};

declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
    /** Set when the caller authenticated with a wallet key: the only wallet it may act on. */
    walletKeyScope?: WalletRef;
  }
  interface FastifyContextConfig {
    /** Routes a wallet key may call (its wallet's spend keys); every other route refuses it. */
    walletKeyAllowed?: boolean;
  }
}

/** The token of an `Authorization: Bearer <token>` value; anything else counts as no credential. */
export function parseBearer(header: string): string | null {
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1] ?? null;
}

/** Reads `Authorization: Bearer <token>`; anything else counts as no credential. */
export function bearerToken(request: FastifyRequest): string | null {
  const header = request.headers.authorization;
  return typeof header === 'string' ? parseBearer(header) : null;
}

/**
 * Authenticates the bearer key of a standard endpoint: a merchant secret key, or a wallet key on
 * the routes that admit one (403 `forbidden` elsewhere).
 */
export async function authenticateApiKey(storage: Storage, request: FastifyRequest, clock: Clock): Promise<Principal> {
  const token = bearerToken(request);
  if (token === null || !token.startsWith(SECRET_PREFIX.walletKey)) return authenticateSecretKey(storage, token);
  const row = await authenticateWalletKey(storage, token);
  if (!request.routeOptions.config.walletKeyAllowed) {
    throw new ApiError('forbidden', "A wallet key may only manage its own wallet's spend keys.");
  }
  await markWalletKeyUsed(storage, row.id, dateOf(clock).toISOString());
  request.walletKeyScope = { walletId: row.wallet_id, connectionId: row.connection_id };
  return {
    merchantId: row.merchant_id,
    merchantWalletId: row.merchant_wallet_id,
    serviceChargeRate: row.service_charge_rate === null ? null : BigInt(row.service_charge_rate),
    keyId: row.id,
  };
}

/** A live wallet key's row, or 401 `unauthorized` (unknown or revoked). */
export async function authenticateWalletKey(storage: Storage, token: string): Promise<ActiveWalletKeyRow> {
  const hash = hashSecret(token);
  const row = await findActiveWalletKeyByHash(storage, hash);
  // The lookup is by hash; the constant-time compare keeps the final decision free of timing leaks.
  if (!row || !hashesEqual(row.key_hash, hash)) throw new ApiError('unauthorized', 'Invalid or revoked wallet key.');
  return row;
}

/** Resolves a merchant secret key to its principal, or throws 401. */
export async function authenticateSecretKey(storage: Storage, token: string | null): Promise<Principal> {
  if (!token) throw new ApiError('unauthorized', 'Missing API key: send Authorization: Bearer <secret key>.');
  const hash = hashSecret(token);
  const row = await keyLookupOf(storage).load(hash);
  // The lookup is by hash; the constant-time compare keeps the final decision free of timing leaks.
  if (!row || !hashesEqual(row.key_hash, hash)) throw new ApiError('unauthorized', 'Invalid or revoked API key.');
  return {
    merchantId: row.merchant_id,
    keyId: row.id,
    merchantWalletId: row.merchant_wallet_id,
    serviceChargeRate: row.service_charge_rate === null ? null : BigInt(row.service_charge_rate),
  };
}

/**
 * Secret keys are looked up anew for every request (a revoked key stops working at once, on every
 * instance); the lookups of requests arriving together share one query.
 */
const keyLookups = new WeakMap<Storage, Coalesced<string, ActiveKeyRow>>();

function keyLookupOf(storage: Storage): Coalesced<string, ActiveKeyRow> {
  let lookup = keyLookups.get(storage);
  if (!lookup) {
    lookup = coalesced(
      (hash) => hash,
      async (hashes) => new Map((await findActiveKeysByHash(storage.db, hashes)).map((row) => [row.key_hash, row])),
    );
    keyLookups.set(storage, lookup);
  }
  return lookup;
}

export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new ApiError('unauthorized');
  return request.principal;
}
