import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { tollgate } from '../helpers/cli.ts';

describe('tollgate webhooks (CLI over the API)', () => {
  let t: TestApp;
  let env: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp('sqlite');
    env = { TOLLGATE_API_URL: await t.listen(), TOLLGATE_SECRET_KEY: t.merchant.secretKey };
  });
  afterAll(async () => t?.close());

  it('creates, updates, rotates, lists deliveries of and deletes a webhook, printing the API answers', async () => {
    const created = await tollgate(['webhooks', 'create', '--name', 'CLI', '--url', 'https://hooks.example.com/cli', '--events', 'customer.created,connection.deleted'], env);
    expect(created.code, created.stderr).toBe(0);
    const hook = JSON.parse(created.stdout);
    expect(hook).toMatchObject({ name: 'CLI', events: ['customer.created', 'connection.deleted'] });
    expect(hook.webhook_secret).toMatch(/^whsec_/);

    const updated = await tollgate(['webhooks', 'update', hook.webhook_id, '--name', 'CLI 2', '--disable'], env);
    expect(JSON.parse(updated.stdout)).toMatchObject({ name: 'CLI 2', status: 'disabled' });

    const rotated = await tollgate(['webhooks', 'rotate-secret', hook.webhook_id, '--overlap-seconds', '60'], env);
    expect(JSON.parse(rotated.stdout).webhook_secret).not.toBe(hook.webhook_secret);

    const deliveries = await tollgate(['webhooks', 'deliveries', hook.webhook_id, '--limit', '5'], env);
    expect(JSON.parse(deliveries.stdout)).toEqual({ data: [], has_more: false, next_cursor: null });

    const deleted = await tollgate(['webhooks', 'delete', hook.webhook_id], env);
    expect(JSON.parse(deleted.stdout)).toEqual({ id: hook.webhook_id, deleted: true });
  });

  it('exits 1 with the API error message and code when the server refuses', async () => {
    const refused = await tollgate(['webhooks', 'create', '--name', 'bad', '--url', 'https://10.0.0.1/hook'], env);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/private address.*\(webhook_url_refused\)/);
    const noKey = await tollgate(['webhooks', 'list'], { TOLLGATE_API_URL: env.TOLLGATE_API_URL!, TOLLGATE_SECRET_KEY: '' });
    expect(noKey.code).toBe(1);
    expect(noKey.stderr).toMatch(/--secret-key|TOLLGATE_SECRET_KEY/);
  });
});
