import { Command } from 'commander';
import type { Config } from '../config.ts';
import { isValidEmail } from '../domain/email.ts';
import type { Storage } from '../storage/db.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { findMerchant, MIN_PASSWORD_LENGTH, normalizedEmail, setMerchantEmail, setMerchantLogin } from '../storage/merchants.ts';
import { migrateToLatest } from '../storage/migrate.ts';
import { createPasswordReset, PASSWORD_RESET_TTL_MS } from '../storage/password-resets.ts';
import { deleteMerchantSessions } from '../storage/sessions.ts';
import { systemClock } from '../domain/clock.ts';

type Tools = {
  withStorage(work: (storage: Storage) => Promise<void>): Promise<void>;
  config(): Config;
  fail(message: string): never;
};

/** `admin set-password` and `admin reset-link`: an operator restores (or first gives) a merchant's dashboard access. */
export function accountCommands({ withStorage, config, fail }: Tools): Command[] {
  const checkEmail = (email: string | undefined) => {
    if (email !== undefined && !isValidEmail(email.trim())) fail(`${email} is not a valid email address.`);
  };
  const takenEmail = (email: string) => (e: unknown): never => {
    if (isUniqueViolation(e)) fail(`Another merchant already signs in with ${normalizedEmail(email)}.`);
    throw e;
  };

  const setPassword = new Command('set-password')
    .description("set a merchant's dashboard password (and its sign-in email with --email); signs it out everywhere")
    .requiredOption('--merchant <merchant_id>', 'merchant id (mer_…)')
    .requiredOption('--password <password>', `new password, at least ${MIN_PASSWORD_LENGTH} characters`)
    .option('--email <email>', 'sign-in email to set (required if the merchant has none)')
    .action(async (opts: { merchant: string; password: string; email?: string }) => {
      checkEmail(opts.email);
      if (opts.password.length < MIN_PASSWORD_LENGTH) fail(`The password must have at least ${MIN_PASSWORD_LENGTH} characters.`);
      await withStorage(async (storage) => {
        await migrateToLatest(storage);
        const merchant = await findMerchant(storage, opts.merchant);
        if (!merchant) return fail(`No merchant with id ${opts.merchant}.`);
        if (!merchant.email && opts.email === undefined) fail(`Merchant ${opts.merchant} has no sign-in email; give one with --email.`);
        const login = { password: opts.password, ...(opts.email === undefined ? {} : { email: opts.email }) };
        await setMerchantLogin(storage.db, opts.merchant, login).catch(takenEmail(opts.email ?? ''));
        await deleteMerchantSessions(storage, opts.merchant);
        console.log(`Merchant ${opts.merchant} signs in as ${opts.email === undefined ? merchant.email : normalizedEmail(opts.email)} with the new password.`);
      });
    });

  const resetLink = new Command('reset-link')
    .description('print a one-time link where a merchant chooses a new dashboard password (expires in 24 hours)')
    .requiredOption('--merchant <merchant_id>', 'merchant id (mer_…)')
    .option('--email <email>', 'sign-in email to set first (required if the merchant has none)')
    .option('--base-url <url>', "this Tollgate's public address; default PUBLIC_BASE_URL, else http://localhost:PORT")
    .action(async (opts: { merchant: string; email?: string; baseUrl?: string }) => {
      checkEmail(opts.email);
      const base = baseUrlOf(opts.baseUrl, config(), fail);
      await withStorage(async (storage) => {
        await migrateToLatest(storage);
        const merchant = await findMerchant(storage, opts.merchant);
        if (!merchant) return fail(`No merchant with id ${opts.merchant}.`);
        if (!merchant.email && opts.email === undefined) fail(`Merchant ${opts.merchant} has no sign-in email; give one with --email.`);
        if (opts.email !== undefined) await setMerchantEmail(storage, opts.merchant, opts.email).catch(takenEmail(opts.email));
        const token = await createPasswordReset(storage, opts.merchant, systemClock.now());
        const link = new URL('/dashboard/reset-password', base);
        link.searchParams.set('token', token);
        console.log(link.toString());
        console.error(`Single use, valid for ${PASSWORD_RESET_TTL_MS / 3_600_000} hours. Send it to the merchant privately.`);
      });
    });

  return [setPassword, resetLink];
}

function baseUrlOf(given: string | undefined, config: Config, fail: (message: string) => never): string {
  const base = given ?? config.publicBaseUrl ?? `http://localhost:${config.port}`;
  try {
    const url = new URL(base);
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new TypeError('scheme');
    return url.toString();
  } catch {
    return fail(`--base-url must be an http(s) URL, not ${base}.`);
  }
}
