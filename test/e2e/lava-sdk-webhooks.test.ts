import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

/** The published client's webhooks resource (11.2: create, list, retrieve, update, delete) over loopback HTTP. */
describe.each(databasesUnderTest())('published Lava client webhooks against the server on %s', (dialect) => {
  let t: TestApp;
  let base: string;
  beforeAll(async () => {
    t = await startTestApp(dialect);
    base = await t.listen();
  });
  afterAll(async () => t?.close());
  checkResponsesAgainstOpenApi(() => t);

  it('creates, lists, retrieves, updates and deletes webhooks, and reports the fourth as an error', async () => {
    const m = await t.newMerchant();
    const lava = new Lava(m.secretKey, { baseUrl: `${base}/v1/` });

    const created = await lava.webhooks.create({ name: 'Orders', url: 'https://hooks.example.com/a' });
    expect(created).toMatchObject({ name: 'Orders', url: 'https://hooks.example.com/a' });
    expect(created.webhook_id).toMatch(/^wh_/);
    expect(created.webhook_secret).toMatch(/^whsec_/);

    const list = await lava.webhooks.list();
    expect(list.data.map((w) => w.webhook_id)).toEqual([created.webhook_id]);
    expect(list.has_more).toBe(false);
    expect(list.data[0]).not.toHaveProperty('webhook_secret');

    const retrieved = await lava.webhooks.retrieve(created.webhook_id);
    expect(retrieved).toMatchObject({ webhook_id: created.webhook_id, name: 'Orders', created_at: created.created_at });

    const updated = await lava.webhooks.update(created.webhook_id, { name: 'Orders v2', url: 'https://hooks.example.com/b' });
    expect(updated).toMatchObject({ webhook_id: created.webhook_id, name: 'Orders v2', url: 'https://hooks.example.com/b' });

    await lava.webhooks.create({ name: 'Two', url: 'https://hooks.example.com/2' });
    await lava.webhooks.create({ name: 'Three', url: 'https://hooks.example.com/3' });
    await expect(lava.webhooks.create({ name: 'Four', url: 'https://hooks.example.com/4' })).rejects.toThrow(/400.*webhook_limit_reached/);

    expect(await lava.webhooks.delete(created.webhook_id)).toEqual({ id: created.webhook_id, deleted: true });
    await expect(lava.webhooks.retrieve(created.webhook_id)).rejects.toThrow(/404/);
  });
});
