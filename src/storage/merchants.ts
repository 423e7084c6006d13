import { randomBytes, scrypt, scryptSync, timingSafeEqual } from 'node:crypto';
import { promisify } from 'node:util';
import { newId } from '../domain/ids.ts';
import type { Storage } from './db.ts';
import type { MerchantsTable } from './schema.ts';
import { insertSecretKey } from './secret-keys.ts';
import { insertWallet } from './wallets.ts';

export type MerchantRow = MerchantsTable;

export type NewMerchant = { name: string; email?: string; password?: string };

/** A merchant is born with its own wallet and a first secret key, in one transaction. */
export async function createMerchant(
  storage: Storage,
  input: NewMerchant,
  createdAt: string,
): Promise<{ merchant: MerchantRow; secretKey: string; secretKeyId: string }> {
  return storage.db.transaction().execute(async (trx) => {
    const merchantId = newId('merchant');
    const wallet = await insertWallet(trx, { merchantId, ownerType: 'merchant', createdAt });
    const merchant: MerchantRow = {
      id: merchantId,
      name: input.name,
      email: input.email === undefined ? null : normalizedEmail(input.email),
      password_hash: input.password ? hashPassword(input.password) : null,
      service_charge_rate: null,
      wallet_id: wallet.id,
      created_at: createdAt,
    };
    await trx.insertInto('merchants').values(merchant).execute();
    const { row, secret } = await insertSecretKey(trx, merchantId, 'Default', createdAt);
    return { merchant, secretKey: secret, secretKeyId: row.id };
  });
}

/**
 * Login emails are compared as one would type them: `Ops@Acme.example` and `ops@acme.example` are
 * the same person, so they are stored lower-cased (and the unique index sees them as one).
 */
export function normalizedEmail(email: string): string {
  return email.trim().toLowerCase();
}

export async function findMerchant(storage: Storage, id: string): Promise<MerchantRow | undefined> {
  return storage.db.selectFrom('merchants').selectAll().where('id', '=', id).executeTakeFirst();
}

/** scrypt with a per-password salt; stored as `scrypt$<salt>$<hash>`. */
function hashPassword(password: string): string {
  const salt = randomBytes(16);
  return storedHash(salt, scryptSync(password, salt, 32));
}

function storedHash(salt: Buffer, hash: Buffer): string {
  return `scrypt$${salt.toString('base64')}$${hash.toString('base64')}`;
}

const scryptAsync = promisify(scrypt) as (password: string, salt: Buffer, keylen: number) => Promise<Buffer>;

/** A hash of a password nobody has: checked when the e-mail is unknown, so timing does not tell. */
const DECOY_HASH = hashPassword(randomBytes(16).toString('hex'));

/** Checks a password against a stored `scrypt$<salt>$<hash>` (off the event loop), in constant time. */
export async function verifyPassword(password: string, stored: string | null): Promise<boolean> {
  const [scheme, salt, hash] = (stored ?? DECOY_HASH).split('$');
  if (scheme !== 'scrypt' || !salt || !hash) return false;
  const expected = Buffer.from(hash, 'base64');
  const actual = await scryptAsync(password, Buffer.from(salt, 'base64'), expected.length);
  return timingSafeEqual(actual, expected) && stored !== null;
}

export async function findMerchantByEmail(storage: Storage, email: string): Promise<MerchantRow | undefined> {
  return storage.db.selectFrom('merchants').selectAll().where('email', '=', normalizedEmail(email)).executeTakeFirst();
}

/** The shortest dashboard password accepted anywhere (sign-up, change, reset, the CLI). */
export const MIN_PASSWORD_LENGTH = 10;

/**
 * Sets a merchant's dashboard password and, when given, its login email (a merchant created without
 * one gains it here). False when no such merchant; a taken email throws a unique violation.
 */
export async function setMerchantLogin(
  db: Storage['db'],
  merchantId: string,
  login: { password: string; email?: string },
): Promise<boolean> {
  const result = await db
    .updateTable('merchants')
    .set({
      password_hash: await hashPasswordAsync(login.password),
      ...(login.email === undefined ? {} : { email: normalizedEmail(login.email) }),
    })
    .where('id', '=', merchantId)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

/** Sets only the login email (e.g. before sending a reset link to a merchant that had none). */
export async function setMerchantEmail(storage: Storage, merchantId: string, email: string): Promise<boolean> {
  const result = await storage.db
    .updateTable('merchants')
    .set({ email: normalizedEmail(email) })
    .where('id', '=', merchantId)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

async function hashPasswordAsync(password: string): Promise<string> {
  const salt = randomBytes(16);
  return storedHash(salt, await scryptAsync(password, salt, 32));
}

/** Per-merchant service-charge override (percent of the fee, 1e-10 units); null = operator default. */
export async function setServiceChargeRate(storage: Storage, merchantId: string, rate: bigint | null): Promise<boolean> {
  const result = await storage.db
    .updateTable('merchants')
    .set({ service_charge_rate: rate })
    .where('id', '=', merchantId)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}
