import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebhookDispatcher } from '../../src/webhooks/dispatcher.ts';
import { useSignedInDashboard } from '../helpers/dashboard.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';
import { loopbackDispatcher, startReceiver, type Received, type Receiver } from '../helpers/webhook-receiver.ts';

const hex = (secret: string, body: string) => createHmac('sha256', secret).update(body).digest('hex');
const standardVerify = (secret: string, r: Received) => new Webhook(secret).verify(r.body, r.headers as Record<string, string>);

/**
 * Managing a webhook endpoint from its dashboard page in real Chromium: edit its URL and events
 * (bad input refused under each field), send a test event, read a delivery's payload and the
 * answer it got, rotate the secret, disable, enable and delete it. Each step is proved by what
 * the API then says and what a real receiver on loopback gets (signatures checked); the API's own
 * answers are held against the served OpenAPI document.
 */
describe('dashboard webhook management (Chromium)', () => {
  const d = useSignedInDashboard('manage-hooks@shop.example', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
  checkResponsesAgainstOpenApi(() => d.t);
  let first: Receiver;
  let second: Receiver;
  let dispatcher: WebhookDispatcher;
  let answer = { status: 200, body: 'thanks' };
  let webhookId = '';
  let secret = '';

  beforeAll(async () => {
    first = await startReceiver();
    second = await startReceiver((_req, res) => (res.writeHead(answer.status, { 'content-type': 'text/plain' }).end(answer.body), 'handled'));
    dispatcher = loopbackDispatcher(d.t);
  });
  afterAll(async () => {
    await dispatcher?.stop();
    await first?.close();
    await second?.close();
  });

  const round = async () => {
    await dispatcher.tick();
    await dispatcher.drain();
  };
  const api = async (method: string, path: string) => {
    const res = await fetch(`${d.base}${path}`, { method, headers: { authorization: `Bearer ${d.secretKey}` } });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  const post = async (button: string) => {
    const [response] = await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: button, exact: true }).click()]);
    await d.page.waitForLoadState();
    return response.status();
  };

  it('adds a webhook for chosen events only', async () => {
    await d.page.goto(`${d.base}/dashboard/webhooks`);
    await d.page.getByLabel('Name').fill('Orders');
    await d.page.getByLabel('URL (https)').fill(first.url);
    await d.page.getByLabel('Every event, including ones added later').uncheck();
    await d.page.getByLabel('customer.created').check();
    expect(await post('Add webhook')).toBe(201);
    secret = (await d.page.textContent('#new-webhook-secret'))!.trim();
    const [hook] = (await api('GET', '/v1/webhooks')).body.data as { webhook_id: string; events: string[] }[];
    expect(hook!.events).toEqual(['customer.created']);
    webhookId = hook!.webhook_id;
  });

  it('edits the URL and events, refusing bad input under each field', async () => {
    await d.visit(`/dashboard/webhooks/${webhookId}`, 'webhook-endpoint');
    await d.page.getByLabel('Name').fill(' ');
    await d.page.getByLabel('URL (https)').fill('ftp://example.com/hook');
    await d.page.getByLabel('customer.created').uncheck();
    expect(await post('Save changes')).toBe(400);
    expect(await d.page.textContent('#edit-name-error')).toBe('Name is required.');
    expect(await d.page.textContent('#edit-events-error')).toBe('Events needs at least one entry.');
    expect(await d.page.getAttribute('#edit-name', 'aria-invalid')).toBe('true');
    expect((await api('GET', `/v1/webhooks/${webhookId}`)).body).toMatchObject({ name: 'Orders', url: first.url, events: ['customer.created'] });

    await d.page.getByLabel('Name').fill('Orders v2');
    await d.page.getByLabel('customer.deleted').check();
    expect(await post('Save changes')).toBe(400);
    expect(await d.page.textContent('#edit-url-error')).toContain('URL');
    await d.page.getByLabel('URL (https)').fill(second.url);
    expect(await post('Save changes')).toBe(303);
    expect(await d.page.textContent('#webhook-notice')).toBe('Changes saved.');
    expect((await api('GET', `/v1/webhooks/${webhookId}`)).body).toMatchObject({ name: 'Orders v2', url: second.url, events: ['customer.deleted'] });
  });

  it('sends a test event to this webhook only, whatever its events, signed with its secret', async () => {
    expect(await post('Send test event')).toBe(303);
    await d.page.waitForSelector('#test-notice');
    await round();
    await second.waitFor(1);
    const got = second.received[0]!;
    expect(JSON.parse(got.body)).toMatchObject({ event: 'webhook.test', data: { webhook_id: webhookId } });
    expect(got.headers['x-webhook-signature']).toBe(hex(secret, got.body));
    expect(() => standardVerify(secret, got)).not.toThrow();
    expect(first.received).toHaveLength(0);
  });

  it("shows a delivery's payload as sent and the answer it got: status, body, time", async () => {
    const [delivery] = (await api('GET', `/v1/webhooks/${webhookId}/deliveries`)).body.data as { delivery_id: string }[];
    const detail = (await api('GET', `/v1/webhooks/${webhookId}/deliveries/${delivery!.delivery_id}`)).body;
    expect(detail).toMatchObject({ event: 'webhook.test', state: 'succeeded', last_status_code: 200, last_response_body: 'thanks' });
    expect(detail.request_body).toBe(second.received[0]!.body);
    expect(detail.last_duration_ms).toEqual(expect.any(Number));

    await d.page.getByRole('link', { name: 'see its delivery' }).click();
    await d.visit(`/dashboard/webhooks/${webhookId}/deliveries/${delivery!.delivery_id}`, 'webhook-delivery');
    expect(await d.page.textContent('#response-status')).toBe('200');
    expect(await d.page.textContent('#response-body')).toBe('thanks');
    expect(await d.page.textContent('#response-time')).toBe(`${detail.last_duration_ms} ms`);
    expect(JSON.parse((await d.page.textContent('#delivery-payload'))!)).toEqual(JSON.parse(second.received[0]!.body));

    // A receiver's error answer is shown as it came, and Redeliver from here sends it again.
    answer = { status: 500, body: 'boom: <b>not ready</b>' };
    expect(await post(`Redeliver webhook.test ${delivery!.delivery_id}`)).toBe(303);
    await d.page.waitForSelector('#redeliver-notice');
    await round();
    await second.waitFor(2);
    await d.page.reload();
    expect(await d.page.textContent('#response-status')).toBe('500');
    expect(await d.page.textContent('#response-body')).toBe('boom: <b>not ready</b>');
    expect(await d.page.textContent('#delivery-state')).toBe('pending');
    answer = { status: 200, body: 'thanks' };
  });

  it('rotates the secret after asking: the new secret is shown once and signs the next delivery', async () => {
    await d.page.goto(`${d.base}/dashboard/webhooks/${webhookId}`);
    await d.page.getByRole('link', { name: 'Rotate secret of Orders v2' }).click();
    await d.visit(`/dashboard/webhooks/${webhookId}/rotate`, 'webhook-rotate');
    expect(await post('Rotate the secret')).toBe(200);
    const rotated = (await d.page.textContent('#new-webhook-secret'))!.trim();
    expect(rotated).toMatch(/^whsec_/);
    expect(rotated).not.toBe(secret);
    expect((await api('GET', `/v1/webhooks/${webhookId}`)).body.previous_secret_expires_at).not.toBeNull();

    const before = second.received.length;
    expect((await api('POST', `/v1/webhooks/${webhookId}/test`)).status).toBe(201);
    await round();
    await second.waitFor(before + 1);
    const got = second.received[before]!;
    expect(got.headers['x-webhook-signature']).toBe(hex(rotated, got.body));
    expect(got.headers['x-webhook-signature-previous']).toBe(hex(secret, got.body));
    expect(() => new Webhook(rotated).verify(got.body, got.headers as Record<string, string>)).not.toThrow();
    await d.page.goto(`${d.base}/dashboard/webhooks/${webhookId}`);
    expect(await d.page.content()).not.toContain(rotated);
  });

  it('disables and enables: a disabled webhook gets nothing and cannot be tested', async () => {
    expect(await post('Disable')).toBe(303);
    expect(await d.page.textContent('#webhook-status')).toContain('disabled');
    expect((await api('GET', `/v1/webhooks/${webhookId}`)).body.status).toBe('disabled');
    expect(await d.page.getByRole('button', { name: 'Send test event' }).count()).toBe(0);
    expect((await api('POST', `/v1/webhooks/${webhookId}/test`)).status).toBe(409);
    const before = second.received.length;
    const customer = (await api('POST', '/v1/customers')).body;
    expect((await api('DELETE', `/v1/customers/${customer.customer_id}`)).status).toBe(200);
    await round();
    expect(second.received).toHaveLength(before);

    expect(await post('Enable')).toBe(303);
    expect((await api('GET', `/v1/webhooks/${webhookId}`)).body.status).toBe('enabled');
    expect(await d.page.getByRole('button', { name: 'Send test event' }).count()).toBe(1);
  });

  it('deletes the webhook after asking, with its deliveries', async () => {
    await d.page.getByRole('link', { name: 'Delete the webhook Orders v2' }).click();
    await d.page.waitForURL((u) => u.pathname.endsWith('/delete'));
    await d.page.getByRole('button', { name: 'Delete the webhook' }).click();
    await d.page.waitForURL((u) => u.searchParams.has('deleted'));
    expect(await d.page.textContent('#webhook-message')).toContain('Orders v2');
    expect((await api('GET', `/v1/webhooks/${webhookId}`)).status).toBe(404);
    expect((await api('GET', '/v1/webhooks')).body.data).toEqual([]);
    const noToken = await d.page.request.post(`${d.base}/dashboard/webhooks/${webhookId}/test`, { form: {}, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);
  });
});
