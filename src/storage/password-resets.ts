import { newSecret } from '../domain/ids.ts';
import { hashSecret } from '../domain/secrets.ts';
import type { Storage } from './db.ts';
import { setMerchantLogin } from './merchants.ts';

/** How long a reset link works: long enough to reach a merchant by mail or chat, short enough to go stale. */
export const PASSWORD_RESET_TTL_MS = 24 * 60 * 60_000;

export type ResetRedemption = { outcome: 'ok'; merchantId: string } | { outcome: 'unknown' | 'used' | 'expired' };

/** A new one-time reset token for this merchant; only its hash is kept. */
export async function createPasswordReset(storage: Storage, merchantId: string, now: number, ttlMs = PASSWORD_RESET_TTL_MS): Promise<string> {
  const token = newSecret('passwordReset', 32);
  await storage.db
    .insertInto('password_resets')
    .values({
      token_hash: hashSecret(token),
      merchant_id: merchantId,
      created_at: new Date(now).toISOString(),
      expires_at: new Date(now + ttlMs).toISOString(),
      used_at: null,
    })
    .execute();
  return token;
}

/** Whether a token can still be used, without spending it (to show the form, or say why not). */
export async function checkPasswordReset(storage: Storage, token: string, now: number): Promise<ResetRedemption> {
  const row = await storage.db
    .selectFrom('password_resets')
    .select(['merchant_id', 'expires_at', 'used_at'])
    .where('token_hash', '=', hashSecret(token))
    .executeTakeFirst();
  if (!row) return { outcome: 'unknown' };
  if (row.used_at !== null) return { outcome: 'used' };
  if (row.expires_at <= new Date(now).toISOString()) return { outcome: 'expired' };
  return { outcome: 'ok', merchantId: row.merchant_id };
}

/**
 * Spends the token and sets the new password in one transaction; the spend is a conditional update,
 * so of two concurrent uses exactly one sets a password. Every other unspent link of the merchant
 * is spent with it, and every dashboard session ends.
 */
export async function redeemPasswordReset(storage: Storage, token: string, password: string, now: number): Promise<ResetRedemption> {
  const checked = await checkPasswordReset(storage, token, now);
  if (checked.outcome !== 'ok') return checked;
  const nowIso = new Date(now).toISOString();
  return storage.db.transaction().execute(async (trx): Promise<ResetRedemption> => {
    const spent = await trx
      .updateTable('password_resets')
      .set({ used_at: nowIso })
      .where('token_hash', '=', hashSecret(token))
      .where('used_at', 'is', null)
      .executeTakeFirst();
    if (Number(spent.numUpdatedRows) !== 1) return { outcome: 'used' };
    await trx.updateTable('password_resets').set({ used_at: nowIso }).where('merchant_id', '=', checked.merchantId).where('used_at', 'is', null).execute();
    await setMerchantLogin(trx, checked.merchantId, { password });
    await trx.deleteFrom('dashboard_sessions').where('merchant_id', '=', checked.merchantId).execute();
    return checked;
  });
}
