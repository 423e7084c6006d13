import { newSecret } from '../domain/ids.ts';
import { hashSecret } from '../domain/secrets.ts';
import type { Storage } from './db.ts';
import { insertSecretKey } from './secret-keys.ts';
import { insertWalletKey } from './wallet-keys.ts';

/** How long a code from the browser may wait for its exchange (the interface says 60 s). */
const CLI_CODE_TTL_MS = 60_000;

export type CliCredentials = {
  merchantId: string;
  walletId: string;
  secretKeyId: string;
  secretKey: string;
  walletKeyId: string;
  walletKey: string;
};

export type CliExchange = { outcome: 'ok'; credentials: CliCredentials } | { outcome: 'unknown' | 'used' | 'expired' };

/** A new one-time code for this merchant; only its hash is kept. */
export async function createCliCode(storage: Storage, merchantId: string, now: number): Promise<string> {
  const code = newSecret('cliCode', 32);
  await storage.db
    .insertInto('cli_auth_codes')
    .values({
      code_hash: hashSecret(code),
      merchant_id: merchantId,
      created_at: new Date(now).toISOString(),
      expires_at: new Date(now + CLI_CODE_TTL_MS).toISOString(),
      used_at: null,
    })
    .execute();
  return code;
}

/**
 * Spends a code and mints the credentials it stands for, in one transaction: a new secret key and a
 * wallet key on the merchant's own wallet (for clients of the older shape). The spend is a
 * conditional update, so of two concurrent exchanges of one code exactly one succeeds.
 */
export async function exchangeCliCode(storage: Storage, code: string, now: number): Promise<CliExchange> {
  const codeHash = hashSecret(code);
  const nowIso = new Date(now).toISOString();
  return storage.db.transaction().execute(async (trx): Promise<CliExchange> => {
    const row = await trx
      .selectFrom('cli_auth_codes')
      .innerJoin('merchants', 'merchants.id', 'cli_auth_codes.merchant_id')
      .select(['cli_auth_codes.merchant_id', 'cli_auth_codes.expires_at', 'cli_auth_codes.used_at', 'merchants.wallet_id'])
      .where('cli_auth_codes.code_hash', '=', codeHash)
      .executeTakeFirst();
    if (!row) return { outcome: 'unknown' };
    if (row.used_at !== null) return { outcome: 'used' };
    if (row.expires_at <= nowIso) return { outcome: 'expired' };
    const spent = await trx
      .updateTable('cli_auth_codes')
      .set({ used_at: nowIso })
      .where('code_hash', '=', codeHash)
      .where('used_at', 'is', null)
      .executeTakeFirst();
    if (Number(spent.numUpdatedRows) !== 1) return { outcome: 'used' };
    const label = `CLI login ${nowIso.slice(0, 16).replace('T', ' ')} UTC`;
    const secretKey = await insertSecretKey(trx, row.merchant_id, label, nowIso);
    const walletKey = await insertWalletKey(trx, {
      merchantId: row.merchant_id,
      wallet: { walletId: row.wallet_id, connectionId: null },
      name: label,
      at: nowIso,
    });
    return {
      outcome: 'ok',
      credentials: {
        merchantId: row.merchant_id,
        walletId: row.wallet_id,
        secretKeyId: secretKey.row.id,
        secretKey: secretKey.secret,
        walletKeyId: walletKey.row.id,
        walletKey: walletKey.secret,
      },
    };
  });
}
