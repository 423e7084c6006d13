import { Command, InvalidArgumentError, Option } from 'commander';
import type { AppDeps } from '../app-deps.ts';
import { ConfigError, loadConfig, type Config } from '../config.ts';
import { formatMoney, MAX_AMOUNT_UNITS, MoneyFormatError, parseMoney } from '../domain/money.ts';
import { ApiError } from '../http/errors.ts';
import { verifyLedger } from '../ledger/verify.ts';
import { createMerchantAccount, setMerchantServiceCharge } from '../services/merchants.ts';
import { BUCKET_ORDER, creditWalletBucket, type Bucket } from '../services/wallets.ts';
import { openStorage, type Storage } from '../storage/db.ts';
import { migrateToLatest } from '../storage/migrate.ts';
import { accountCommands } from './accounts.ts';
import { ApiCallError } from './api-client.ts';
import { billingCommands } from './billing.ts';
import { commerceCommands } from './commerce.ts';
import { webhookCommands } from './webhooks.ts';
import { sessionCommands } from './login.ts';
import { systemClock } from '../domain/clock.ts';

const program = new Command()
  .name('tollgate')
  .description('Tollgate: a self-hostable AI gateway with exact usage billing.\n' +
    'Reads DATABASE_URL (default sqlite:./data/tollgate.db) like the server, so admin commands act on its database.')
  .showHelpAfterError();

program
  .command('serve')
  .description('start the HTTP server (runs pending migrations first)')
  .action(async () => {
    // Loaded only to serve: the other commands start without the whole server's code.
    const { startServer, stopOnSignals } = await import('../main.ts');
    const server = await startServer(config());
    stopOnSignals(server);
  });

program
  .command('migrate')
  .description('apply pending database migrations and exit')
  .action(async () => {
    await withStorage(async (storage) => {
      const applied = await migrateToLatest(storage);
      console.log(applied.length ? `Applied: ${applied.join(', ')}` : 'Database is up to date.');
    });
  });

const admin = program.command('admin').description('operator actions on the database');

admin
  .command('create-merchant')
  .description('create a merchant with its wallet and first secret key')
  .requiredOption('--name <name>', 'merchant name')
  .option('--email <email>', 'login email for the dashboard')
  .option('--password <password>', 'login password for the dashboard')
  .option('--json', 'print {merchant_id, secret_key, wallet_id} as JSON')
  .addOption(new Option('--print <field>', 'print only this field, e.g. for VAR=$(…) in a script').choices(['merchant_id', 'secret_key', 'wallet_id']))
  .action(async (opts: { name: string; email?: string; password?: string; json?: boolean; print?: string }) => {
    if ((opts.email === undefined) !== (opts.password === undefined)) fail('Give --email and --password together, or neither.');
    await withServices(async (deps) => {
      const { merchant, secretKey } = await createMerchantAccount(deps, opts);
      const out = { merchant_id: merchant.id, secret_key: secretKey, wallet_id: merchant.wallet_id };
      if (opts.print) console.log(out[opts.print as keyof typeof out]);
      else if (opts.json) console.log(JSON.stringify(out));
      else {
        console.log(`Merchant ${out.merchant_id} created.`);
        console.log(`Wallet:     ${out.wallet_id}`);
        console.log(`Secret key: ${out.secret_key}  (shown once; store it now)`);
      }
    });
  });

admin
  .command('credit-wallet')
  .description('add money to a wallet (e.g. a merchant wallet)')
  .requiredOption('--wallet <wallet_id>', 'wallet id (wal_…)')
  .requiredOption('--amount <amount>', 'positive decimal amount, at most 10 fractional digits', amountParser({ allowZero: false }))
  .addOption(
    new Option('--bucket <bucket>', 'which bucket to fill; charges take cycle credit first, then bundle, then prepaid')
      .choices(BUCKET_ORDER)
      .default('prepaid'),
  )
  .action(async (opts: { wallet: string; amount: bigint; bucket: Bucket }) => {
    await withServices(async (deps) => {
      const balance = await creditWalletBucket(deps, opts.wallet, opts.amount, opts.bucket);
      console.log(`Wallet ${opts.wallet} balance: ${formatMoney(balance)} (credited ${formatMoney(opts.amount)} to ${opts.bucket})`);
    });
  });

admin
  .command('verify-ledger')
  .description('rebuild every wallet balance from the ledger postings; exits 1 on any mismatch')
  .option('--progress', 'print progress to stderr (the default when stderr is a terminal)')
  .option('--no-progress', 'never print progress')
  .action(async (opts: { progress?: boolean }) => {
    const showProgress = opts.progress ?? process.stderr.isTTY === true;
    await withStorage(async (storage) => {
      await migrateToLatest(storage);
      const { problemCount, wallets, transactions } = await verifyLedger(storage, {
        onProblem: (p) => console.error(`${p.kind} ${p.id}: ${p.detail}`),
        ...(showProgress ? { onProgress: (at) => console.error(`checked ${at.transactions} transactions, ${at.wallets} wallets`) } : {}),
      });
      if (problemCount > 0) fail(`Ledger check failed: ${problemCount} problem(s).`);
      console.log(`Ledger consistent: ${transactions} transactions, ${wallets} wallets.`);
    });
  });

admin
  .command('set-service-charge')
  .description("set a merchant's service-charge rate (percent of the fee), or --default to use the operator's")
  .requiredOption('--merchant <merchant_id>', 'merchant id (mer_…)')
  .option('--rate <percent>', 'e.g. 1.9 for 1.9 %', amountParser({ allowZero: true }))
  .option('--default', "clear the override and use SERVICE_CHARGE_RATE")
  .action(async (opts: { merchant: string; rate?: bigint; default?: boolean }) => {
    if ((opts.rate === undefined) === !opts.default) fail('Give exactly one of --rate or --default.');
    await withServices(async (deps) => {
      await setMerchantServiceCharge(deps, opts.merchant, opts.default ? null : opts.rate!);
      console.log(`Merchant ${opts.merchant} service charge: ${opts.default ? 'operator default' : `${formatMoney(opts.rate!)} %`}`);
    });
  });

for (const command of accountCommands({ withServices, config, fail })) admin.addCommand(command);
program.addCommand(webhookCommands(printApiAnswer));
for (const command of sessionCommands(printApiAnswer)) program.addCommand(command);
for (const command of billingCommands(printApiAnswer)) program.addCommand(command);
for (const command of commerceCommands(printApiAnswer)) program.addCommand(command);

/** Prints what an API command answered as JSON, or its error message with exit code 1. */
async function printApiAnswer(work: () => Promise<unknown>, human?: ((answer: unknown) => string) | null): Promise<void> {
  try {
    const answer = await work();
    // A command given a summary prints it; the others (and --json) print the API's answer.
    console.log(human ? human(answer) : JSON.stringify(answer, null, 2));
  } catch (e) {
    if (e instanceof ApiCallError) fail(e.message);
    throw e;
  }
}

/** Commander parser for a decimal amount: at most 10 fractional digits, never negative. */
function amountParser({ allowZero }: { allowZero: boolean }) {
  return (value: string): bigint => {
    try {
      const units = parseMoney(value);
      if (units < 0n || (units === 0n && !allowZero)) {
        throw new InvalidArgumentError(allowZero ? 'must not be negative' : 'must be positive');
      }
      if (units > MAX_AMOUNT_UNITS) throw new InvalidArgumentError(`must be at most ${formatMoney(MAX_AMOUNT_UNITS)}`);
      return units;
    } catch (e) {
      if (e instanceof MoneyFormatError) throw new InvalidArgumentError(e.message);
      throw e;
    }
  };
}

function config(): Config {
  try {
    return loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) fail(e.message);
    throw e;
  }
}

async function withStorage(work: (storage: Storage) => Promise<void>): Promise<void> {
  const storage = openStorage(config().databaseUrl, { poolSize: 2 });
  try {
    await work(storage);
  } finally {
    await storage.close();
  }
}

/**
 * Runs an operator command on the services, as the server would: the database DATABASE_URL
 * names, migrated first, and the system clock. A refusal (an ApiError) is printed as its message
 * with exit code 1, or as `messageOf` words it for the command line.
 */
async function withServices(work: (deps: Pick<AppDeps, 'storage' | 'clock'>) => Promise<void>, messageOf = (e: ApiError) => e.message): Promise<void> {
  await withStorage(async (storage) => {
    await migrateToLatest(storage);
    await work({ storage, clock: systemClock }).catch((e: unknown) => {
      if (e instanceof ApiError) fail(messageOf(e));
      throw e;
    });
  });
}

function fail(message: string): never {
  console.error(message);
  process.exit(1);
}

await program.parseAsync(process.argv).catch((e: unknown) => fail(e instanceof Error ? e.message : String(e)));
