/**
 * Forward-gateway credentials: where the caller's credential travels, what it is (a raw merchant
 * secret key or a base64 JSON forward token), and who pays for the request it authorises.
 *
 * Decisions:
 * - Placement precedence: `Authorization: Bearer`, `x-api-key`, `x-goog-api-key`, `xi-api-key`,
 *   then the `key` query parameter. The first placement holding a non-empty value wins; a
 *   non-Bearer `Authorization` (e.g. `Basic …`) counts as absent. These are every placement the
 *   interface lists (`x-<vendor>-api-key` = Google's, `<vendor>-api-key` = ElevenLabs').
 * - A credential starting with a raw-key prefix (`sk_live_`, `spk_live_`, `wk_live_`) is a key and
 *   is never decoded. A wallet key is refused (401 when not live, else 403 `forbidden`): it only
 *   manages spend keys.
 *   Anything else must be base64 (standard or URL alphabet, padding optional) of UTF-8 JSON of an
 *   object, else 400 `forward_token_json_invalid`; member types are checked by zod (same code,
 *   with `issues`). Unknown members are ignored, so a newer client's extra member does not break.
 * - Absent and `null` members mean the same (the published client relies on it), and
 *   `disable_billing: false` means the same as absent.
 * - Combinations the published client refuses, or that make no sense, are 400
 *   `forward_token_invalid`: customer_id/connection_id without meter_slug; connection_secret without
 *   product_secret; connection_id and customer_id naming different customers; members of the older
 *   (connection_secret/product_secret) and newer (connection_id|customer_id/meter_slug/
 *   disable_billing: true) tokens together; `disable_billing: true` without a customer and a meter.
 * - The token's secret_key is authenticated like a bearer key (unknown or revoked → 401
 *   `unauthorized`). A customer or meter that does not exist (or is deleted, or belongs to another
 *   merchant) is also 401: the credential as a whole is wrong, and it reveals nothing the secret
 *   key's owner could not list anyway.
 * - Who pays (reference "Who pays" table):
 *   raw secret key, or a token with secret_key only      → `merchant`, merchant wallet pays;
 *   token without customer/meter but with provider_key  → `unmanaged_metering`, merchant "pays"
 *     (with the caller's provider key the provider bills the caller and there is no meter fee, so
 *     in practice nothing is charged; usage is still recorded). The SDK's "merchant billing with
 *     provider_key" and "BYOK both null" shapes are the same JSON once absent = null, so they
 *     share this mode;
 *   meter only (meter_slug, or product_secret alone)      → `meter_only`, merchant pays, usage
 *     attributed to the meter;
 *   customer + meter (either vocabulary)                  → `customer`, the customer's wallet pays
 *     per the meter's payers (base_cost_payer / service_charge_payer may still put parts on the
 *     merchant's wallet);
 *   + disable_billing: true                               → `billing_disabled`: the request is
 *     recorded for the customer and meter, nothing is checked or charged on the customer's wallet,
 *     and the merchant's wallet pays what the request really costs the gateway (the provider's base
 *     cost on a managed key) — otherwise disable_billing would be free use of the operator's
 *     provider keys. No fee is charged (it would be the merchant paying itself).
 * - `providerKey` is the caller's own provider key; when set the record's provider_key_type is
 *   `unmanaged` and the base cost is informational only: the provider bills the caller directly.
 */
import type { IncomingHttpHeaders } from 'node:http';
import { z } from 'zod';
import { SECRET_PREFIX } from '../domain/ids.ts';
import { authenticateSecretKey, authenticateWalletKey, parseBearer } from '../http/auth.ts';
import { ApiError, type Issue } from '../http/errors.ts';
import { findConnection, findConnectionBySecret } from '../storage/connections.ts';
import type { Storage } from '../storage/db.ts';
import { findMerchant } from '../storage/merchants.ts';
import { findMeterBySecret, findMeterBySlug } from '../storage/meters.ts';
import { drawsPlanCredit } from '../storage/subscriptions.ts';
import type { CredentialCache } from './credential-cache.ts';
import { authenticateSpendKey, isSpendKeyToken } from './spend-key-guard.ts';
import type { BillingContext } from '../ledger/billing.ts';

// ---------------------------------------------------------------------------------------------
// Placement

export type CredentialPlacement = 'authorization' | 'x-api-key' | 'x-goog-api-key' | 'xi-api-key' | 'query-key';

export type ExtractedCredential = { token: string; placement: CredentialPlacement };

/** The credential headers, in precedence order after `authorization`. */
const KEY_HEADERS = ['x-api-key', 'x-goog-api-key', 'xi-api-key'] as const;

function headerValue(value: string | string[] | undefined): string | null {
  const first = Array.isArray(value) ? value[0] : value;
  if (typeof first !== 'string') return null;
  const trimmed = first.trim();
  return trimmed === '' ? null : trimmed;
}

/**
 * Finds the caller's credential: `Authorization: Bearer <t>`, then `x-api-key`, `x-goog-api-key`,
 * `xi-api-key`, then the `key` query parameter (already removed from the target URL by the caller,
 * so it never reaches the provider). The first non-empty one wins; null when there is none.
 */
export function extractCredential(
  headers: IncomingHttpHeaders,
  strippedQueryKey: string | null,
): ExtractedCredential | null {
  const authorization = headerValue(headers.authorization);
  const bearer = authorization === null ? null : parseBearer(authorization);
  if (bearer !== null) return { token: bearer, placement: 'authorization' };
  for (const name of KEY_HEADERS) {
    const value = headerValue(headers[name]);
    if (value !== null) return { token: value, placement: name };
  }
  const key = strippedQueryKey?.trim();
  if (key) return { token: key, placement: 'query-key' };
  return null;
}

// ---------------------------------------------------------------------------------------------
// Forward token

/** Prefixes of credentials that are used raw and never decoded as a forward token. */
const RAW_KEY_PREFIXES: readonly string[] = [SECRET_PREFIX.secretKey, SECRET_PREFIX.spendKey, SECRET_PREFIX.walletKey];

/** A decoded forward token; absent and null members are both null. */
export type ForwardToken = {
  /** `older`: connection_secret/product_secret; `newer`: connection_id|customer_id/meter_slug. */
  generation: 'older' | 'newer';
  secret_key: string;
  connection_secret: string | null;
  product_secret: string | null;
  /** connection_id or customer_id (the same object under two names). */
  customer_id: string | null;
  meter_slug: string | null;
  provider_key: string | null;
  disable_billing: boolean;
};

/** Members are looked up in the database, whose text cannot hold NUL: refused like a bad member. */
const NO_NUL = [(v: string) => !v.includes('\u0000'), 'must not contain the NUL character (\\u0000)'] as const;

const member = (max: number) =>
  z
    .string({ error: 'must be a string or null' })
    .min(1, 'must not be empty')
    .max(max, `must be at most ${max} characters`)
    .refine(...NO_NUL)
    .nullish();

const tokenSchema = z.object({
  secret_key: z
    .string({ error: (issue) => (issue.input === undefined ? 'is required' : 'must be a string') })
    .min(1, 'must not be empty')
    .max(255, 'must be at most 255 characters')
    .refine(...NO_NUL),
  connection_secret: member(255),
  product_secret: member(255),
  connection_id: member(255),
  customer_id: member(255),
  meter_slug: member(100),
  provider_key: member(4096),
  disable_billing: z.boolean({ error: 'must be a boolean or null' }).nullish(),
});

const STANDARD_ALPHABET = /^[A-Za-z0-9+/]+$/;
const URL_ALPHABET = /^[A-Za-z0-9_-]+$/;

/** Standard or URL-safe base64, padding optional but correct when present; null when it is not base64. */
function decodeBase64(text: string): Buffer | null {
  const body = text.replace(/={1,2}$/, '');
  const padding = text.length - body.length;
  if (body.length === 0 || body.length % 4 === 1) return null;
  if (!STANDARD_ALPHABET.test(body) && !URL_ALPHABET.test(body)) return null;
  if (padding > 0 && text.length % 4 !== 0) return null;
  // Node's base64 decoder reads both alphabets.
  return Buffer.from(body, 'base64');
}

function jsonInvalid(message: string, issues?: Issue[]): ApiError {
  return new ApiError('forward_token_json_invalid', message, issues ? { issues } : {});
}

function tokenInvalid(message: string, path: string[]): ApiError {
  return new ApiError('forward_token_invalid', message, { issues: [{ path, message }] });
}

/**
 * A raw secret key → 'not_a_token'. Anything else is decoded as a forward token, or throws 400
 * `forward_token_json_invalid` (not base64 / UTF-8 / JSON object, wrong member types) or
 * `forward_token_invalid` (a combination of members no client may send). Never echoes the token.
 */
export function decodeForwardToken(token: string): ForwardToken | 'not_a_token' {
  if (RAW_KEY_PREFIXES.some((prefix) => token.startsWith(prefix))) return 'not_a_token';

  const bytes = decodeBase64(token);
  if (!bytes) throw jsonInvalid('The forward token is not base64: expected a secret key or base64-encoded JSON.');
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw jsonInvalid('The forward token does not decode to UTF-8 text.');
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw jsonInvalid('The forward token does not decode to JSON.');
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw jsonInvalid('The forward token must decode to a JSON object.');
  }
  const result = tokenSchema.safeParse(parsed);
  if (!result.success) {
    const issues: Issue[] = result.error.issues.map((i) => ({ path: i.path.map(String), message: i.message }));
    const first = issues[0];
    throw jsonInvalid(`The forward token is invalid: ${first ? `${first.path.join('.')}: ${first.message}` : ''}`, issues);
  }
  const t = result.data;
  const connectionSecret = t.connection_secret ?? null;
  const productSecret = t.product_secret ?? null;
  const connectionId = t.connection_id ?? null;
  const customerIdMember = t.customer_id ?? null;
  const meterSlug = t.meter_slug ?? null;
  const disableBilling = t.disable_billing === true;

  const older = connectionSecret !== null || productSecret !== null;
  const newer = connectionId !== null || customerIdMember !== null || meterSlug !== null || disableBilling;
  if (older && newer) {
    throw tokenInvalid(
      'The forward token mixes connection_secret/product_secret with connection_id/customer_id/meter_slug/disable_billing; use one or the other.',
      [],
    );
  }
  if (connectionId !== null && customerIdMember !== null && connectionId !== customerIdMember) {
    throw tokenInvalid('The forward token names different customers in connection_id and customer_id.', ['customer_id']);
  }
  const customerId = customerIdMember ?? connectionId;
  if (customerId !== null && meterSlug === null) {
    throw tokenInvalid('A forward token with customer_id (or connection_id) also needs meter_slug.', ['meter_slug']);
  }
  if (connectionSecret !== null && productSecret === null) {
    throw tokenInvalid('A forward token with connection_secret also needs product_secret.', ['product_secret']);
  }
  if (disableBilling && customerId === null) {
    throw tokenInvalid('disable_billing needs customer_id and meter_slug.', ['disable_billing']);
  }
  return {
    generation: older ? 'older' : 'newer',
    secret_key: t.secret_key,
    connection_secret: connectionSecret,
    product_secret: productSecret,
    customer_id: customerId,
    meter_slug: meterSlug,
    provider_key: t.provider_key ?? null,
    disable_billing: disableBilling,
  };
}

// ---------------------------------------------------------------------------------------------
// Who pays

/**
 * resolveForwardCredential through the instance's credential cache (credential-cache.ts): a
 * credential seen in the last moments is not read again. A cached spend key's expiry is still
 * checked against the clock on every use.
 */
export async function resolveCredential(
  storage: Storage,
  cache: CredentialCache,
  credential: string,
  now: Date,
): Promise<BillingContext> {
  const billing = await cache.resolve(credential, () => resolveForwardCredential(storage, credential, now));
  const expiresAt = billing.spendKey?.expires_at;
  if (expiresAt && expiresAt <= now.toISOString()) {
    throw new ApiError('spend_key_expired', `This spend key expired at ${expiresAt}.`);
  }
  return billing;
}

/**
 * Authenticates the credential found by extractCredential and decides who pays. Throws 401
 * `unauthorized` for an unknown or revoked secret key (bare or inside the token) and for a
 * customer or meter this merchant does not have; 400 as decodeForwardToken does.
 */
export async function resolveForwardCredential(storage: Storage, credential: string, now: Date): Promise<BillingContext> {
  if (isSpendKeyToken(credential)) return resolveSpendKeyCredential(storage, credential, now);
  if (credential.startsWith(SECRET_PREFIX.walletKey)) return refuseWalletKey(storage, credential);
  const decoded = decodeForwardToken(credential);
  const secretKey = decoded === 'not_a_token' ? credential : decoded.secret_key;
  const principal = await authenticateSecretKey(storage, secretKey);
  const merchant = await findMerchant(storage, principal.merchantId);
  if (!merchant) throw new ApiError('unauthorized', 'Invalid or revoked API key.');
  const base = {
    merchantId: merchant.id,
    merchantWalletId: merchant.wallet_id,
    secretKeyId: principal.keyId,
    serviceChargeRate: merchant.service_charge_rate,
  };

  if (decoded === 'not_a_token') {
    return { ...base, mode: 'merchant', connection: null, meter: null, providerKey: null, providerKeyType: 'managed', payer: 'merchant' };
  }

  const merchantId = merchant.id;
  const [connectionRow, meter] = await Promise.all([
    decoded.customer_id !== null
      ? findConnection(storage, merchantId, decoded.customer_id)
      : decoded.connection_secret !== null
        ? findConnectionBySecret(storage, merchantId, decoded.connection_secret)
        : Promise.resolve(null),
    decoded.meter_slug !== null
      ? findMeterBySlug(storage, merchantId, decoded.meter_slug)
      : decoded.product_secret !== null
        ? findMeterBySecret(storage, merchantId, decoded.product_secret)
        : Promise.resolve(null),
  ]);
  const wantsConnection = decoded.customer_id !== null || decoded.connection_secret !== null;
  const wantsMeter = decoded.meter_slug !== null || decoded.product_secret !== null;
  if (wantsConnection && !connectionRow) {
    throw new ApiError(
      'unauthorized',
      decoded.customer_id !== null
        ? `The forward token names customer ${decoded.customer_id}, which this secret key's merchant does not have.`
        : "The forward token's connection_secret does not match a customer of this secret key's merchant.",
    );
  }
  if (wantsMeter && !meter) {
    throw new ApiError(
      'unauthorized',
      decoded.meter_slug !== null
        ? `The forward token names meter_slug ${decoded.meter_slug}, which this secret key's merchant does not have.`
        : "The forward token's product_secret does not match a meter of this secret key's merchant.",
    );
  }

  const providerKey = decoded.provider_key;
  const keys = { providerKey, providerKeyType: providerKey === null ? 'managed' : 'unmanaged' } as const;
  const connection = connectionRow ? { id: connectionRow.id, wallet_id: connectionRow.wallet_id } : null;

  if (connection && meter) {
    if (decoded.disable_billing) return { ...base, ...keys, mode: 'billing_disabled', connection, meter, payer: 'merchant' };
    // Cached with the rest: a subscription or plan change empties the cache (credential-cache.ts).
    const planCredit = await drawsPlanCredit(storage.db, { connectionId: connection.id, meterId: meter.id });
    return { ...base, ...keys, mode: 'customer', connection, meter, payer: 'customer', drawsPlanCredit: planCredit };
  }
  if (meter) return { ...base, ...keys, mode: 'meter_only', connection: null, meter, payer: 'merchant' };
  return {
    ...base,
    ...keys,
    mode: providerKey === null ? 'merchant' : 'unmanaged_metering',
    connection: null,
    meter: null,
    payer: 'merchant',
  };
}

/** A wallet key only manages spend keys: 401 when it is not a live key, else 403 `forbidden`. */
async function refuseWalletKey(storage: Storage, credential: string): Promise<never> {
  await authenticateWalletKey(storage, credential);
  throw new ApiError('forbidden', 'A wallet key only manages its wallet\'s spend keys; call providers with a spend key or a secret key.');
}

/**
 * A spend key pays from its own wallet: the merchant's (`merchant` mode) or a customer's
 * (`customer` mode without a meter: the customer's wallet pays the provider's base cost, no fee;
 * see pricingFor). Its limits are enforced at admission (spend-key-guard.ts).
 */
async function resolveSpendKeyCredential(storage: Storage, credential: string, now: Date): Promise<BillingContext> {
  const key = await authenticateSpendKey(storage, credential, now);
  const merchant = await findMerchant(storage, key.merchant_id);
  if (!merchant) throw new ApiError('unauthorized', 'Invalid or revoked spend key.');
  const base = {
    merchantId: merchant.id,
    merchantWalletId: merchant.wallet_id,
    secretKeyId: key.id,
    serviceChargeRate: merchant.service_charge_rate,
    meter: null,
    providerKey: null,
    providerKeyType: 'managed',
    spendKey: key,
  } as const;
  if (key.connection_id === null) return { ...base, mode: 'merchant', connection: null, payer: 'merchant' };
  const connection = await findConnection(storage, merchant.id, key.connection_id);
  if (!connection) throw new ApiError('unauthorized', "This spend key's customer no longer exists.");
  return { ...base, mode: 'customer', connection: { id: connection.id, wallet_id: connection.wallet_id }, payer: 'customer' };
}
