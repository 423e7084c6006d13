import { randomBytes } from 'node:crypto';
import { newSecret } from '../domain/ids.ts';
import { hashSecret } from '../domain/secrets.ts';
import type { Storage } from './db.ts';

export type Session = { merchantId: string; csrfToken: string; expiresAt: string };

/** A new sign-in; the caller puts the returned token in the cookie, the table keeps its hash. */
export async function createSession(storage: Storage, merchantId: string, now: number, ttlMs: number) {
  const token = newSecret('session', 32);
  const session: Session = {
    merchantId,
    csrfToken: randomBytes(24).toString('base64url'),
    expiresAt: new Date(now + ttlMs).toISOString(),
  };
  await storage.db
    .insertInto('dashboard_sessions')
    .values({
      token_hash: hashSecret(token),
      merchant_id: merchantId,
      csrf_token: session.csrfToken,
      created_at: new Date(now).toISOString(),
      expires_at: session.expiresAt,
    })
    .execute();
  return { token, session };
}

/** The live session a cookie token names; expired ones count as none. */
export async function findSession(storage: Storage, token: string, now: number): Promise<Session | undefined> {
  const row = await storage.db
    .selectFrom('dashboard_sessions')
    .select(['merchant_id', 'csrf_token', 'expires_at'])
    .where('token_hash', '=', hashSecret(token))
    .where('expires_at', '>', new Date(now).toISOString())
    .executeTakeFirst();
  return row && { merchantId: row.merchant_id, csrfToken: row.csrf_token, expiresAt: row.expires_at };
}

export async function deleteSession(storage: Storage, token: string): Promise<void> {
  await storage.db.deleteFrom('dashboard_sessions').where('token_hash', '=', hashSecret(token)).execute();
}

/** Signs the merchant out everywhere (after a password change or reset). */
export async function deleteMerchantSessions(storage: Storage, merchantId: string): Promise<void> {
  await storage.db.deleteFrom('dashboard_sessions').where('merchant_id', '=', merchantId).execute();
}

/**
 * A secret generated once per installation and shared by every instance through the database. Of
 * instances starting together, the first insert wins and the others read it back.
 */
export async function serverSecret(storage: Storage, name: string, createdAt: string): Promise<string> {
  await storage.db
    .insertInto('server_secrets')
    .values({ name, value: randomBytes(32).toString('base64url'), created_at: createdAt })
    .onConflict((oc) => oc.column('name').doNothing())
    .execute();
  const row = await storage.db.selectFrom('server_secrets').select('value').where('name', '=', name).executeTakeFirstOrThrow();
  return row.value;
}
