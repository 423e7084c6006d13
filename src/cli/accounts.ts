import { Command } from 'commander';
import type { AppDeps } from '../app-deps.ts';
import type { Config } from '../config.ts';
import type { ApiError } from '../http/errors.ts';
import { MIN_PASSWORD_LENGTH, NO_EMAIL, passwordResetToken, PASSWORD_RESET_TTL_MS, setMerchantPassword } from '../services/merchants.ts';

type Tools = {
  withServices(work: (deps: Pick<AppDeps, 'storage' | 'clock'>) => Promise<void>, messageOf?: (e: ApiError) => string): Promise<void>;
  config(): Config;
  fail(message: string): never;
};

/** `admin set-password` and `admin reset-link`: an operator restores (or first gives) a merchant's dashboard access. */
export function accountCommands({ withServices, config, fail }: Tools): Command[] {
  /** A merchant without a sign-in email needs one given on the command line. */
  const messageFor = (merchantId: string) => (e: ApiError) =>
    e.issues?.some((issue) => issue.message === NO_EMAIL) ? `Merchant ${merchantId} has no sign-in email; give one with --email.` : e.message;

  const setPassword = new Command('set-password')
    .description("set a merchant's dashboard password (and its sign-in email with --email); signs it out everywhere")
    .requiredOption('--merchant <merchant_id>', 'merchant id (mer_…)')
    .requiredOption('--password <password>', `new password, at least ${MIN_PASSWORD_LENGTH} characters`)
    .option('--email <email>', 'sign-in email to set (required if the merchant has none)')
    .action(async (opts: { merchant: string; password: string; email?: string }) => {
      await withServices(async (deps) => {
        const email = await setMerchantPassword(deps, opts.merchant, opts);
        console.log(`Merchant ${opts.merchant} signs in as ${email} with the new password.`);
      }, messageFor(opts.merchant));
    });

  const resetLink = new Command('reset-link')
    .description('print a one-time link where a merchant chooses a new dashboard password (expires in 24 hours)')
    .requiredOption('--merchant <merchant_id>', 'merchant id (mer_…)')
    .option('--email <email>', 'sign-in email to set first (required if the merchant has none)')
    .option('--base-url <url>', "this Tollgate's public address; default PUBLIC_BASE_URL, else http://localhost:PORT")
    .action(async (opts: { merchant: string; email?: string; baseUrl?: string }) => {
      const base = baseUrlOf(opts.baseUrl, config(), fail);
      await withServices(async (deps) => {
        const token = await passwordResetToken(deps, opts.merchant, opts.email);
        const link = new URL('/dashboard/reset-password', base);
        link.searchParams.set('token', token);
        console.log(link.toString());
        console.error(`Single use, valid for ${PASSWORD_RESET_TTL_MS / 3_600_000} hours. Send it to the merchant privately.`);
      }, messageFor(opts.merchant));
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
