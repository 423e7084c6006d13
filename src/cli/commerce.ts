import { Command, InvalidArgumentError, Option } from 'commander';
import { addApiOptions, callApi, type ApiOptions } from './api-client.ts';

/** Runs an API call and prints its answer: the summary given, or the JSON when it is null. */
type Run = (work: () => Promise<unknown>, human: ((answer: unknown) => string) | null) => Promise<void>;
type Json = { json?: boolean };
type Item = Record<string, unknown>;

const enc = encodeURIComponent;
const listOf = (value: string) => value.split(',').map((s) => s.trim()).filter(Boolean);
const itemsOf = (answer: unknown) => ((answer as { data?: Item[] }).data ?? []) as Item[];

/** A credit bundle given as name:cost:credit, e.g. "Boost:5:6". */
function bundleParser(value: string, previous: Item[] = []): Item[] {
  const [name, cost, credit] = value.split(':');
  if (!name || !cost || !credit) throw new InvalidArgumentError('give a bundle as name:cost:credit_amount, e.g. Boost:5:6');
  return [...previous, { name, cost, credit_amount: credit }];
}

/**
 * `tollgate plans …`, `tollgate subscriptions …`, `tollgate checkout create` and `tollgate payments …`: the commerce
 * operations of the API, for a merchant (its secret key), over HTTP. `--json` prints the API's
 * answer as is; otherwise a line per item.
 */
export function commerceCommands(run: Run): Command[] {
  const plans = new Command('plans').description("a merchant's subscription plans, through the API");
  addApiOptions(plans.command('list').description('list the plans'))
    .option('--json', 'print the API answer')
    .action((o: ApiOptions & Json) =>
      run(() => callApi(o, 'GET', 'plans?limit=100'), o.json ? null : (a) => itemsOf(a).map((p) => `${p.plan_id}  ${p.name}  ${p.period_amount}/${p.billing_interval}  credit ${p.included_credit}`).join('\n')),
    );
  addApiOptions(plans.command('create').description('create a plan'))
    .requiredOption('--name <name>', 'display name')
    .requiredOption('--period-amount <amount>', 'price per billing interval, e.g. 25.00')
    .addOption(new Option('--billing-interval <interval>', 'billing interval').choices(['day', 'week', 'month', 'year']).makeOptionMandatory())
    .option('--included-credit <amount>', 'credit granted each cycle (default: the period amount)')
    .addOption(new Option('--rollover <type>', 'unused cycle credit at the cycle end').choices(['full', 'none']))
    .addOption(new Option('--bundle-rollover <type>', 'unused bundle credit at the cycle end').choices(['full', 'none']))
    .option('--meter <ids>', 'comma-separated meter ids linked to the plan', listOf)
    .option('--bundle <name:cost:credit>', 'a credit bundle sold with the plan (repeatable)', bundleParser)
    .option('--json', 'print the API answer')
    .action((o: ApiOptions & Json & { name: string; periodAmount: string; billingInterval: string; includedCredit?: string; rollover?: string; bundleRollover?: string; meter?: string[]; bundle?: Item[] }) =>
      run(
        () =>
          callApi(o, 'POST', 'plans', {
            name: o.name,
            period_amount: o.periodAmount,
            billing_interval: o.billingInterval,
            ...(o.includedCredit !== undefined ? { included_credit: o.includedCredit } : {}),
            ...(o.rollover ? { rollover_type: o.rollover } : {}),
            ...(o.bundleRollover ? { bundle_rollover_type: o.bundleRollover } : {}),
            ...(o.meter ? { meter_ids: o.meter } : {}),
            ...(o.bundle ? { credit_bundles: o.bundle } : {}),
          }),
        o.json ? null : (a) => `Plan ${(a as Item).plan_id} created.`,
      ),
    );

  const subscriptions = new Command('subscriptions').description("a merchant's subscriptions, through the API");
  addApiOptions(subscriptions.command('list').description('list subscriptions'))
    .addOption(new Option('--status <status>', 'which subscriptions').choices(['active', 'cancelled', 'all']).default('active'))
    .option('--customer <customer_id>', "only this customer's")
    .option('--json', 'print the API answer')
    .action((o: ApiOptions & Json & { status: string; customer?: string }) =>
      run(
        () => callApi(o, 'GET', `subscriptions?limit=100&status=${enc(o.status)}${o.customer ? `&customer_id=${enc(o.customer)}` : ''}`),
        o.json ? null : (a) => itemsOf(a).map((s) => `${s.subscription_id}  ${s.customer_id}  ${s.plan_id}  ${s.status}  until ${s.cycle_end_at ?? s.cancelled_at}`).join('\n'),
      ),
    );
  addApiOptions(subscriptions.command('cancel').description("cancel a subscription at its cycle's end"))
    .argument('<subscription_id>')
    .option('--json', 'print the API answer')
    .action((id: string, o: ApiOptions & Json) => run(() => callApi(o, 'DELETE', `subscriptions/${enc(id)}`), o.json ? null : () => `Subscription ${id} will be cancelled at its cycle's end.`));

  const checkout = new Command('checkout').description('checkout sessions, through the API');
  addApiOptions(checkout.command('create').description('create a checkout session; prints its token and page URL'))
    .addOption(new Option('--mode <mode>', 'checkout mode').choices(['onboarding', 'topup', 'subscription', 'credit_bundle']).makeOptionMandatory())
    .requiredOption('--origin-url <url>', 'the site that opens the checkout')
    .option('--customer <customer_id>', 'the customer (topup, credit_bundle; optional for subscription)')
    .option('--plan <plan_id>', 'the plan (subscription)')
    .option('--bundle <credit_bundle_id>', 'the credit bundle (credit_bundle)')
    .option('--reference <reference_id>', 'your own identifier')
    .option('--json', 'print the API answer')
    .action((o: ApiOptions & Json & { mode: string; originUrl: string; customer?: string; plan?: string; bundle?: string; reference?: string }) =>
      run(
        () =>
          callApi(o, 'POST', 'checkout_sessions', {
            checkout_mode: o.mode,
            origin_url: o.originUrl,
            ...(o.customer ? { customer_id: o.customer } : {}),
            ...(o.plan ? { plan_id: o.plan } : {}),
            ...(o.bundle ? { credit_bundle_id: o.bundle } : {}),
            ...(o.reference ? { reference_id: o.reference } : {}),
          }),
        o.json ? null : (a) => `Checkout ${(a as Item).checkout_session_id}\nToken: ${(a as Item).checkout_session_token}\nPage:  ${(a as Item).checkout_url}`,
      ),
    );
  return [plans, subscriptions, checkout, paymentsCommand(run)];
}

/** `tollgate payments list|refund`: the merchant's payments and their refunds (decision 0038). */
function paymentsCommand(run: Run): Command {
  const payments = new Command('payments').description("a merchant's payments and refunds, through the API");
  addApiOptions(payments.command('list').description('list payments, newest first'))
    .addOption(new Option('--status <status>', 'only payments in this status').choices(['pending', 'requires_action', 'succeeded', 'failed']))
    .addOption(new Option('--purpose <purpose>', 'only payments of this kind').choices(['checkout', 'renewal', 'auto_top_up']))
    .option('--json', 'print the API answer')
    .action((o: ApiOptions & Json & { status?: string; purpose?: string }) =>
      run(
        () => callApi(o, 'GET', `payments?limit=100${o.status ? `&status=${enc(o.status)}` : ''}${o.purpose ? `&purpose=${enc(o.purpose)}` : ''}`),
        o.json ? null : (a) => itemsOf(a).map((p) => `${p.payment_id}  ${p.customer_id ?? '-'}  ${p.purpose}  ${p.status}  ${p.amount}  refunded ${p.amount_refunded}  ${p.created_at}`).join('\n'),
      ),
    );
  addApiOptions(payments.command('refund').description('refund a payment through the payment provider (by default as much as the unspent credit allows)'))
    .argument('<payment_id>')
    .option('--amount <amount>', 'the money to give back, e.g. 5.00')
    .option('--reason <text>', 'why, kept with the refund')
    .option('--json', 'print the API answer')
    .action((id: string, o: ApiOptions & Json & { amount?: string; reason?: string }) =>
      run(
        () => callApi(o, 'POST', `payments/${enc(id)}/refund`, { ...(o.amount ? { amount: o.amount } : {}), ...(o.reason ? { reason: o.reason } : {}) }),
        o.json
          ? null
          : (a) => {
              const refund = (a as { refund: Item }).refund;
              return `Refund ${refund.refund_id} of ${refund.amount} ${refund.status === 'pending' ? 'recorded; the payment provider has not answered yet' : 'accepted'} (credit taken back: ${refund.credit_amount}).`;
            },
      ),
    );
  return payments;
}
