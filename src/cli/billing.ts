import { Command, InvalidArgumentError, Option } from 'commander';
import { RATE_TYPES, TIER_TYPES } from '../domain/meters.ts';
import { addApiOptions, ApiCallError, callApi, type ApiOptions } from './api-client.ts';

/** Runs an API call and prints its answer: the summary given, or the JSON when it is null. */
type Run = (work: () => Promise<unknown>, human: ((answer: unknown) => string) | null) => Promise<void>;
type Output = { json?: boolean; print?: string };
type Item = Record<string, unknown>;

const enc = encodeURIComponent;
const itemsOf = (answer: unknown) => ((answer as { data?: Item[] }).data ?? []) as Item[];

/** `--json` prints the API's answer, `--print <field>` one field of it (for scripts), else the summary. */
function withOutput(command: Command): Command {
  return command
    .option('--json', 'print the API answer')
    .option('--print <field>', 'print only this field of the answer, e.g. for VAR=$(…) in a script');
}

function outputOf(o: Output, summary: (answer: Item) => string): ((answer: unknown) => string) | null {
  if (o.json) return null;
  if (o.print) return (answer) => fieldOf(answer as Item, o.print!);
  return (answer) => summary(answer as Item);
}

function fieldOf(answer: Item, field: string): string {
  const value = answer[field];
  if (value === undefined) throw new ApiCallError(`The answer has no field ${field}; it has ${Object.keys(answer).join(', ')}.`);
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/**
 * `tollgate meters|customers|forward-tokens|wallet-keys|requests …`: what a merchant needs from
 * a new account to a first billed call and its record, through the API with its secret key, so no
 * request body has to be worked out by hand.
 */
export function billingCommands(run: Run): Command[] {
  return [meterCommands(run), customerCommands(run), forwardTokenCommands(), walletKeyCommands(run), requestCommands(run)];
}

function meterCommands(run: Run): Command {
  const meters = new Command('meters').description("a merchant's meters (what a request is charged), through the API");
  withOutput(addApiOptions(meters.command('list').description('list the meters'))).action((o: ApiOptions & Output) =>
    run(() => callApi(o, 'GET', 'meters?limit=100'), outputOf(o, (a) => itemsOf(a).map(meterLine).join('\n'))),
  );
  withOutput(addApiOptions(meters.command('create').description('create a meter with one rate (one tier from 0)')))
    .requiredOption('--name <name>', 'display name')
    .requiredOption('--rate <amount>', 'the price per tier unit (fixed), or the percent of the base cost (percentage)')
    .option('--slug <slug>', 'the meter_slug forward tokens name (default: made from the name)')
    .addOption(new Option('--rate-type <type>', 'what the rate is').choices(RATE_TYPES).default('fixed'))
    .addOption(new Option('--tier-type <unit>', 'the unit a fixed rate is per').choices(TIER_TYPES).default('tokens_1m'))
    .action((o: ApiOptions & Output & { name: string; rate: string; slug?: string; rateType: string; tierType: string }) =>
      run(
        () =>
          callApi(o, 'POST', 'meters', {
            name: o.name,
            ...(o.slug ? { meter_slug: o.slug } : {}),
            rate_type: o.rateType,
            tier_type: o.tierType,
            tiers: [{ start: 0, rate: o.rate }],
          }),
        outputOf(o, (a) => `Meter ${a.meter_id} created (slug ${a.meter_slug}).`),
      ),
    );
  return meters;
}

function meterLine(m: Item): string {
  const [tier] = (m.tiers as { rate: string; type: string }[] | undefined) ?? [];
  return `${m.meter_id}  ${m.meter_slug}  ${m.name}  ${m.rate_type} ${tier?.rate ?? ''} per ${tier?.type ?? ''}`;
}

function customerCommands(run: Run): Command {
  const customers = new Command('customers').description("a merchant's customers and their credit, through the API");
  withOutput(addApiOptions(customers.command('list').description('list the customers')))
    .option('--reference <reference_id>', 'only the customer with this reference')
    .action((o: ApiOptions & Output & { reference?: string }) =>
      run(
        () => callApi(o, 'GET', `customers?limit=100${o.reference ? `&reference_id=${enc(o.reference)}` : ''}`),
        outputOf(o, (a) => itemsOf(a).map(customerLine).join('\n')),
      ),
    );
  withOutput(addApiOptions(customers.command('create').description('create a customer (with its wallet)')))
    .option('--name <name>', 'full name ("Ada Lovelace")')
    .option('--email <email>', 'email address')
    .option('--reference <reference_id>', 'your own identifier for the customer (unique)')
    .action((o: ApiOptions & Output & { name?: string; email?: string; reference?: string }) =>
      run(
        () =>
          callApi(o, 'POST', 'customers', {
            ...(o.name ? { name: o.name } : {}),
            ...(o.email ? { email: o.email } : {}),
            ...(o.reference ? { reference_id: o.reference } : {}),
          }),
        outputOf(o, (a) => `Customer ${a.customer_id} created (wallet ${(a.wallet as Item).wallet_id}).`),
      ),
    );
  withOutput(addApiOptions(customers.command('credit').description("grant credit to a customer's wallet")))
    .argument('<customer_id>')
    .requiredOption('--amount <amount>', 'a positive decimal amount, e.g. 5.00')
    .option('--description <text>', 'why (shown in the credit history)')
    .action((id: string, o: ApiOptions & Output & { amount: string; description?: string }) =>
      run(
        () => callApi(o, 'POST', `customers/${enc(id)}/credits`, { amount: o.amount, ...(o.description ? { description: o.description } : {}) }),
        outputOf(o, (a) => `Credited ${a.amount} to ${a.customer_id}; balance ${a.balance}.`),
      ),
    );
  return customers;
}

function customerLine(c: Item): string {
  const contact = (c.contact as Item | undefined) ?? {};
  const name = [contact.first_name, contact.last_name].filter(Boolean).join(' ') || '-';
  return `${c.customer_id}  ${name}  ${contact.email ?? '-'}  balance ${(c.wallet as Item | undefined)?.balance ?? '?'}`;
}

/**
 * A forward token is made, not stored: the base64 JSON of the merchant's secret key, the customer
 * and the meter (and optionally the caller's own provider key), as the published client makes it.
 * Made here from the same key the other commands use; nothing is sent to the server.
 */
function forwardTokenCommands(): Command {
  const tokens = new Command('forward-tokens').description('forward tokens: the credential of a billed forwarded call');
  addApiOptions(tokens.command('create').description("print a forward token that bills a customer's calls to a meter"))
    .option('--customer <customer_id>', 'the customer who pays (give --meter too)')
    .option('--meter <meter_slug>', 'the meter the calls are charged by')
    .option('--provider-key <key>', "the caller's own provider key (the provider bills it; Tollgate meters)")
    .action((o: ApiOptions & { customer?: string; meter?: string; providerKey?: string }) => {
      if (!o.secretKey) throw new InvalidArgumentError('Give --secret-key, set TOLLGATE_SECRET_KEY, or run tollgate login.');
      if (o.customer && !o.meter) throw new InvalidArgumentError('A customer is billed by a meter: give --meter too.');
      const token = { secret_key: o.secretKey, ...(o.customer ? { customer_id: o.customer } : {}), ...(o.meter ? { meter_slug: o.meter } : {}), ...(o.providerKey ? { provider_key: o.providerKey } : {}) };
      console.log(Buffer.from(JSON.stringify(token)).toString('base64'));
    });
  return tokens;
}

function walletKeyCommands(run: Run): Command {
  const keys = new Command('wallet-keys').description("wallet keys (manage one wallet's spend keys), through the API");
  withOutput(addApiOptions(keys.command('list').description('list the wallet keys'))).action((o: ApiOptions & Output) =>
    run(() => callApi(o, 'GET', 'wallet_keys?limit=100'), outputOf(o, (a) => itemsOf(a).map((k) => `${k.wallet_key_id}  ${k.key_preview}  ${k.name}  ${k.wallet_id}`).join('\n'))),
  );
  withOutput(addApiOptions(keys.command('create').description("create a wallet key (shown once): the merchant's wallet, or a customer's")))
    .option('--customer <customer_id>', "the customer whose wallet it manages (default: the merchant's)")
    .option('--name <name>', 'display name')
    .action((o: ApiOptions & Output & { customer?: string; name?: string }) =>
      run(
        () => callApi(o, 'POST', 'wallet_keys', { ...(o.name ? { name: o.name } : {}), ...(o.customer ? { customer_id: o.customer } : {}) }),
        outputOf(o, (a) => `Wallet key ${a.wallet_key_id} for ${a.wallet_id}: ${a.key}  (shown once; store it now)`),
      ),
    );
  return keys;
}

function requestCommands(run: Run): Command {
  const requests = new Command('requests').description('request records (what each call was charged), through the API');
  withOutput(addApiOptions(requests.command('list').description('list the latest request records')))
    .option('--customer <customer_id>', "only this customer's")
    .option('--limit <n>', 'how many (1-100)', '10')
    .action((o: ApiOptions & Output & { customer?: string; limit: string }) =>
      run(
        () => callApi(o, 'GET', `requests?limit=${enc(o.limit)}${o.customer ? `&customer_id=${enc(o.customer)}` : ''}`),
        outputOf(o, (a) => itemsOf(a).map(requestLine).join('\n') || 'No requests yet.'),
      ),
    );
  return requests;
}

function requestLine(r: Item): string {
  const usage = (r.model_usage as Item | undefined) ?? {};
  return `${r.request_id}  ${r.status}  ${r.provider ?? '-'}/${r.model ?? '-'}  ${usage.input_tokens ?? 0} in + ${usage.output_tokens ?? 0} out tokens  wallet ${r.total_wallet_cost}  ${r.created_at}`;
}
