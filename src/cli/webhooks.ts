import { Command, InvalidArgumentError } from 'commander';
import { addApiOptions, callApi, type ApiOptions } from './api-client.ts';

const list = (value: string) => value.split(',').map((s) => s.trim()).filter(Boolean);
function positiveInteger(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError('must be a whole number');
  return n;
}

/** `tollgate webhooks …`: the /v1/webhooks operations, for a merchant, over the HTTP API. Prints the JSON answers. */
export function webhookCommands(run: (work: () => Promise<unknown>) => Promise<void>): Command {
  const webhooks = new Command('webhooks').description("manage a merchant's webhooks through the API (needs its secret key)");
  const sub = (name: string, description: string) => addApiOptions(webhooks.command(name).description(description));
  const enc = encodeURIComponent;

  sub('list', 'list the webhooks').action((o: ApiOptions) => run(() => callApi(o, 'GET', 'webhooks?limit=100')));

  sub('create', 'create a webhook; prints its secret (shown only once)')
    .requiredOption('--name <name>', 'display name')
    .requiredOption('--url <url>', 'https:// URL that receives the events')
    .option('--events <names>', 'comma-separated event names (default: every event)', list)
    .action((o: ApiOptions & { name: string; url: string; events?: string[] }) =>
      run(() => callApi(o, 'POST', 'webhooks', { name: o.name, url: o.url, ...(o.events ? { events: o.events } : {}) })),
    );

  sub('get', 'show one webhook')
    .argument('<webhook_id>')
    .action((id: string, o: ApiOptions) => run(() => callApi(o, 'GET', `webhooks/${enc(id)}`)));

  sub('update', 'change a webhook')
    .argument('<webhook_id>')
    .option('--name <name>')
    .option('--url <url>')
    .option('--events <names>', 'comma-separated event names, or * for every event', list)
    .option('--enable', 'deliver again (also after the endpoint was disabled for failing)')
    .option('--disable', 'stop delivering')
    .action((id: string, o: ApiOptions & { name?: string; url?: string; events?: string[]; enable?: boolean; disable?: boolean }) =>
      run(() => {
        const body = {
          ...(o.name !== undefined ? { name: o.name } : {}),
          ...(o.url !== undefined ? { url: o.url } : {}),
          ...(o.events !== undefined ? { events: o.events } : {}),
          ...(o.enable ? { enabled: true } : o.disable ? { enabled: false } : {}),
        };
        return callApi(o, 'PATCH', `webhooks/${enc(id)}`, body);
      }),
    );

  sub('delete', 'delete a webhook and its deliveries')
    .argument('<webhook_id>')
    .action((id: string, o: ApiOptions) => run(() => callApi(o, 'DELETE', `webhooks/${enc(id)}`)));

  sub('rotate-secret', 'make a new secret; the old one keeps signing during the overlap')
    .argument('<webhook_id>')
    .option('--overlap-seconds <n>', 'how long the old secret keeps signing (default 86400)', positiveInteger)
    .action((id: string, o: ApiOptions & { overlapSeconds?: number }) =>
      run(() => callApi(o, 'POST', `webhooks/${enc(id)}/rotate_secret`, o.overlapSeconds !== undefined ? { overlap_seconds: o.overlapSeconds } : {})),
    );

  sub('deliveries', "list a webhook's recent deliveries")
    .argument('<webhook_id>')
    .option('--limit <n>', '1 to 100 (default 10)', positiveInteger)
    .action((id: string, o: ApiOptions & { limit?: number }) =>
      run(() => callApi(o, 'GET', `webhooks/${enc(id)}/deliveries${o.limit !== undefined ? `?limit=${o.limit}` : ''}`)),
    );

  sub('redeliver', 'send a delivery again')
    .argument('<webhook_id>')
    .argument('<delivery_id>')
    .action((id: string, deliveryId: string, o: ApiOptions) =>
      run(() => callApi(o, 'POST', `webhooks/${enc(id)}/deliveries/${enc(deliveryId)}/redeliver`, {})),
    );

  return webhooks;
}
