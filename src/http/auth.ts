import type { FastifyRequest } from 'fastify';
import { hashSecret, hashesEqual } from '../domain/secrets.ts';
import type { Storage } from '../storage/db.ts';
import { coalesced, type Coalesced } from '../storage/coalesce.ts';
import { findActiveKeysByHash, type ActiveKeyRow } from '../storage/secret-keys.ts';
import { ApiError } from './errors.ts';

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
  }
}

/** Reads `Authorization: Bearer <token>`; anything else counts as no credential. */
export function bearerToken(request: FastifyRequest): string | null {
  const header = request.headers.authorization;
  if (typeof header !== 'string') return null;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1] ?? null;
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
