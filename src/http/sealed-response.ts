import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';

/**
 * Stored idempotent responses are sealed (decision 0019): a POST that creates a key (secret,
 * spend, wallet) answers with the raw key, and its replay must be able to answer it again for
 * 24 h, but a raw key must never be readable from the database. Each response is encrypted with
 * AES-256-GCM under a key derived from the caller's own credential (which the database holds
 * only as a hash) and the Idempotency-Key: the same caller retrying can open it, a reader of the
 * database cannot, and no server-side key needs managing.
 */

const VERSION = 'sealed.v1.';
const IV_BYTES = 12;
const TAG_BYTES = 16;

/** The place of one stored response: whose it is and under which Idempotency-Key. */
export type SealContext = { credential: string; scope: string; key: string };

function keyOf({ credential, scope, key }: SealContext): Buffer {
  return Buffer.from(hkdfSync('sha256', credential, `${scope}\n${key}`, 'tollgate idempotent response', 32));
}

export function sealResponse(body: string, context: SealContext): string {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', keyOf(context), iv);
  const sealed = Buffer.concat([cipher.update(body, 'utf8'), cipher.final()]);
  return VERSION + Buffer.concat([iv, cipher.getAuthTag(), sealed]).toString('base64url');
}

/**
 * The stored response, opened; null when it cannot be opened with this context (a replay can
 * only come from the same credential, so this means the row was altered). A row stored before
 * sealing (plain JSON, gone within 24 h of the upgrade) is returned as it is.
 */
export function openResponse(stored: string, context: SealContext): string | null {
  if (!stored.startsWith(VERSION)) return stored;
  const raw = Buffer.from(stored.slice(VERSION.length), 'base64url');
  try {
    const decipher = createDecipheriv('aes-256-gcm', keyOf(context), raw.subarray(0, IV_BYTES));
    decipher.setAuthTag(raw.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
    return Buffer.concat([decipher.update(raw.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString('utf8');
  } catch {
    return null;
  }
}
