import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebhookDispatcher } from '../../src/webhooks/dispatcher.ts';
import { signedInDashboard, tableRows, type DashboardSession } from '../helpers/dashboard.ts';
import { loopbackDispatcher, startReceiver, type Receiver } from '../helpers/webhook-receiver.ts';

/**
 * Webhooks from the dashboard in real Chromium: an endpoint added from the page (its secret shown
 * once), its delivery history as the dispatcher leaves it, and a failed delivery sent again with
 * the Redeliver button — proved by the receiver getting the same event a second time.
 */
describe('dashboard webhooks (Chromium)', () => {
  let d: DashboardSession;
  let receiver: Receiver;
  let dispatcher: WebhookDispatcher;
  let webhookId: string;
  let failFirst = true;

  beforeAll(async () => {
    d = await signedInDashboard('hooks@shop.example', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
    // The first delivery fails (500), later ones succeed.
    receiver = await startReceiver(() => (failFirst ? ((failFirst = false), 500) : 200));
    dispatcher = loopbackDispatcher(d.t);
  });
  afterAll(async () => {
    await dispatcher?.stop();
    await receiver?.close();
    await d?.close();
  });

  const round = async () => {
    await dispatcher.tick();
    await dispatcher.drain();
  };

  it('says how to add a first webhook when there is none, and refuses a URL that is not allowed', async () => {
    await d.visit('/dashboard/webhooks', 'webhooks-empty');
    expect(await d.page.textContent('main')).toContain('No webhooks yet');
    await d.page.getByLabel('URL (https)').fill('ftp://example.com/hook');
    await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: 'Add webhook' }).click()]);
    expect(await d.page.textContent('#wh-url-error')).toContain('URL');
    expect(await d.page.getAttribute('#wh-url', 'aria-invalid')).toBe('true');
    expect((await d.api('GET', '/v1/webhooks')).body.data).toEqual([]);
  });

  it('adds a webhook from the page and shows its signing secret once', async () => {
    await d.page.getByLabel('Name').fill('Backend');
    await d.page.getByLabel('URL (https)').fill(receiver.url);
    await d.page.getByRole('button', { name: 'Add webhook' }).click();
    const secret = (await d.page.textContent('#new-webhook-secret'))!.trim();
    expect(secret).toMatch(/^whsec_/);
    const [hook] = (await d.api('GET', '/v1/webhooks')).body.data;
    expect(hook).toMatchObject({ name: 'Backend', url: receiver.url, events: ['*'], status: 'enabled' });
    webhookId = hook.webhook_id;
    await d.page.goto(`${d.base}/dashboard/webhooks`);
    expect(await d.page.content()).not.toContain(secret);
    await d.visit(`/dashboard/webhooks/${webhookId}`, 'webhook-no-deliveries');
    expect(await d.page.textContent('main')).toContain('No deliveries yet');
  });

  it('shows the delivery history, and Redeliver sends a failed delivery again with the same event', async () => {
    await d.api('POST', '/v1/customers', { email: 'hooked@example.com' });
    await round();
    await receiver.waitFor(1);
    const [delivery] = (await d.api('GET', `/v1/webhooks/${webhookId}/deliveries`)).body.data;
    expect(delivery).toMatchObject({ event: 'customer.created', state: 'pending', attempts: 1, last_status_code: 500 });

    await d.visit(`/dashboard/webhooks/${webhookId}`, 'webhook');
    const [row] = await tableRows(d.page, '#deliveries');
    expect(row!.slice(1, 3)).toEqual(['pending', '1']);
    expect(row![3]).toMatch(/^500 \(\d+ ms\)$/);

    await d.page.getByRole('button', { name: `Redeliver customer.created ${delivery.delivery_id}` }).click();
    await d.page.waitForSelector('#redeliver-notice');
    const again = (await d.api('GET', `/v1/webhooks/${webhookId}/deliveries`)).body.data[0];
    expect(again).toMatchObject({ delivery_id: delivery.delivery_id, state: 'pending', attempts: 0 });
    await round();
    await receiver.waitFor(2);
    expect(JSON.parse(receiver.received[1]!.body).id).toBe(delivery.event_id);
    await d.page.reload();
    expect(await d.page.textContent(`#delivery-${delivery.delivery_id} .state`)).toBe('succeeded');

    const noToken = await d.page.request.post(`${d.base}/dashboard/webhooks/${webhookId}/deliveries/${delivery.delivery_id}/redeliver`, { form: {}, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);
  });

  it('pages the delivery history 25 at a time: "Older deliveries" leads to the rest, each delivery once', async () => {
    for (let i = 0; i < 26; i++) await d.api('POST', '/v1/customers', { email: `paged-${i}@example.com` });
    await round();
    const overApi = (await d.api('GET', `/v1/webhooks/${webhookId}/deliveries?limit=100`)).body.data.map((x: { delivery_id: string }) => x.delivery_id);
    expect(overApi).toHaveLength(27);

    await d.page.goto(`${d.base}/dashboard/webhooks/${webhookId}`);
    const idsOnPage = async () => d.page.$$eval('#deliveries tbody tr', (rows) => rows.map((row) => row.id.replace(/^delivery-/, '')));
    const first = await idsOnPage();
    expect(first).toHaveLength(25);
    await d.page.getByRole('link', { name: 'Older deliveries' }).click();
    await d.page.waitForURL((u) => u.searchParams.has('cursor'));
    const second = await idsOnPage();
    expect(second).toHaveLength(2);
    expect(await d.page.getByRole('link', { name: 'Older deliveries' }).count()).toBe(0);
    expect([...first, ...second]).toEqual(overApi);
  });
});
