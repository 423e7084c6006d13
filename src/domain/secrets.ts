import { createHash, timingSafeEqual } from 'node:crypto';

/** Secrets are stored only as this hash. */
export function hashSecret(secret: string): string {
  return createHash('sha256').update(secret, 'utf8').digest('hex');
}

export function hashesEqual(a: string, b: string): boolean {
  const ab = Buffer.from(a, 'hex');
  const bb = Buffer.from(b, 'hex');
  return ab.length === bb.length && timingSafeEqual(ab, bb);
}

/**
 * A preview that identifies a key to its owner without revealing it: the known prefix, 4 random
 * characters, then asterisks. The cut is at the prefix, never at the last underscore: the random
 * part is base64url and may itself contain `_`.
 */
export function secretHint(secret: string, prefix: string): string {
  return `${secret.slice(0, prefix.length + 4)}${'*'.repeat(8)}`;
}
