import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { tollgate } from '../helpers/cli.ts';

/**
 * `tollgate meters|customers|forward-tokens|wallet-keys|requests`: from a new merchant to a billed
 * call and its record without writing a request body, against a server listening on loopback.
 */
// Each command is a new node process (a second or more on a busy machine): the tests get the time for several.
describe('tollgate meters, customers, credits, forward tokens, wallet keys and requests (CLI over the API)', { timeout: 120_000 }, () => {
  let t: TestApp;
  let env: Record<string, string>;
  let base: string;
  beforeAll(async () => {
    t = await startTestApp('sqlite');
    base = await t.listen();
    env = { TOLLGATE_API_URL: base, TOLLGATE_SECRET_KEY: t.merchant.secretKey };
  });
  afterAll(async () => t?.close());

  const ok = async (args: string[]) => {
    const result = await tollgate(args, env);
    expect(result.code, result.stderr).toBe(0);
    return result.stdout.trim();
  };
  const api = async (url: string) => (await t.app.inject({ method: 'GET', url, headers: t.auth() })).json();

  it('creates a meter, a customer with credit and a forward token that pays for a demo call, then lists the record', async () => {
    const meter = JSON.parse(await ok(['meters', 'create', '--name', 'Chat tokens', '--slug', 'chat', '--rate', '2.50', '--json']));
    expect(meter).toEqual(await api(`/v1/meters/${meter.meter_id}`));
    expect(meter).toMatchObject({ meter_slug: 'chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '2.5000000000', type: 'tokens_1m' }] });
    expect(await ok(['meters', 'list'])).toContain(`${meter.meter_id}  chat  Chat tokens  fixed 2.5000000000 per tokens_1m`);

    const customerId = await ok(['customers', 'create', '--name', 'Ada Lovelace', '--email', 'ada@example.com', '--print', 'customer_id']);
    expect(customerId).toMatch(/^con_/);
    expect(await ok(['customers', 'credit', customerId, '--amount', '5.00', '--description', 'welcome'])).toBe(
      `Credited 5.0000000000 to ${customerId}; balance 5.0000000000.`,
    );
    expect((await api(`/v1/customers/${customerId}`)).wallet.balance).toBe('5.0000000000');
    expect(await ok(['customers', 'list'])).toContain(`${customerId}  Ada Lovelace  ada@example.com  balance 5.0000000000`);

    const token = await ok(['forward-tokens', 'create', '--customer', customerId, '--meter', 'chat']);
    expect(JSON.parse(Buffer.from(token, 'base64').toString('utf8'))).toEqual({ secret_key: t.merchant.secretKey, customer_id: customerId, meter_slug: 'chat' });
    const openai = new OpenAI({ apiKey: token, baseURL: `${base}/v1`, maxRetries: 0 });
    const { response } = await openai.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hi' }] }).withResponse();
    const requestId = response.headers.get('x-tollgate-request-id')!;
    const record = await t.settledRecord(requestId);
    expect(record).toMatchObject({ status: 'completed', customer_id: customerId, meter_id: meter.meter_id, provider: 'demo' });

    const listed = JSON.parse(await ok(['requests', 'list', '--customer', customerId, '--json']));
    expect(listed.data).toEqual([record]);
    expect(await ok(['requests', 'list', '--customer', customerId])).toBe(
      `${requestId}  completed  demo/demo-chat  ${record.model_usage.input_tokens} in + ${record.model_usage.output_tokens} out tokens  wallet ${record.total_wallet_cost}  ${record.created_at}`,
    );
  });

  it("creates and lists a wallet key for a customer's wallet, the key shown once", async () => {
    const customerId = await ok(['customers', 'create', '--print', 'customer_id']);
    const created = JSON.parse(await ok(['wallet-keys', 'create', '--customer', customerId, '--name', 'Ada app', '--json']));
    expect(created).toMatchObject({ name: 'Ada app', customer_id: customerId, key: expect.stringMatching(/^wk_live_/) });
    const listed = await ok(['wallet-keys', 'list']);
    expect(listed).toContain(`${created.wallet_key_id}  ${created.key_preview}  Ada app  ${created.wallet_id}`);
    expect(listed).not.toContain(created.key);
  });

  it('refuses bad input with the API error or a usage message, exit code 1, and writes nothing', async () => {
    const customerId = await ok(['customers', 'create', '--print', 'customer_id']);
    const badAmount = await tollgate(['customers', 'credit', customerId, '--amount', '-3'], env);
    expect(badAmount.code).toBe(1);
    expect(badAmount.stderr).toMatch(/\(validation_error\)/);
    expect((await api(`/v1/customers/${customerId}`)).wallet.balance).toBe('0.0000000000');

    const noMeter = await tollgate(['forward-tokens', 'create', '--customer', customerId], env);
    expect(noMeter.code).toBe(1);
    expect(noMeter.stderr).toMatch(/give --meter too/);

    const unknownField = await tollgate(['customers', 'list', '--print', 'nope'], env);
    expect(unknownField.code).toBe(1);
    expect(unknownField.stderr).toMatch(/no field nope/);
  });
});
