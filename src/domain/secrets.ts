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

/** A preview that identifies a key to its owner without revealing it: prefix, 4 chars, asterisks. */
export function secretHint(secret: string): string {
  const cut = secret.lastIndexOf('_') + 1;
  return `${secret.slice(0, cut + 4)}${'*'.repeat(8)}`;
}
