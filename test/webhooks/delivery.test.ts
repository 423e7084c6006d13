import { createHmac, timingSafeEqual } from 'node:crypto';
import { Writable } from 'node:stream';
import { Webhook } from 'standardwebhooks';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.ts';
import { MAX_ATTEMPTS, RETRY_DELAYS_MS } from '../../src/webhooks/schedule.ts';
import type { Resolver } from '../../src/webhooks/url-safety.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startReceiver, type Received, type Receiver, type Responder } from '../helpers/webhook-receiver.ts';

/** The receiver check docs/webhooks.md gives for X-Webhook-Signature, as a merchant would copy it. */
function hexSignatureValid(secret: string, rawBody: string, header: string | undefined): boolean {
  if (!header) return false;
  const expected = Buffer.from(createHmac('sha256', secret).update(rawBody).digest('hex'), 'hex');
  const given = Buffer.from(header, 'hex');
  return given.length === expected.length && timingSafeEqual(given, expected);
}

const standardVerify = (secret: string, r: Received) => new Webhook(secret).verify(r.body, r.headers as Record<string, string>);

describe.each(databasesUnderTest())('webhook delivery on %s', (dialect) => {
  let t: TestApp;
  let nowMs: number;
  const receivers: Receiver[] = [];
  const dispatchers: WebhookDispatcher[] = [];

  beforeAll(async () => {
    t = await startTestApp(dialect, { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
  });
  afterEach(async () => {
    await Promise.all(dispatchers.splice(0).map((d) => d.stop()));
    await Promise.all(receivers.splice(0).map((r) => r.close()));
  });
  afterAll(async () => t?.close());

  const receiver = async (respond?: Responder) => {
    const r = await startReceiver(respond);
    receivers.push(r);
    return r;
  };
  /** A dispatcher on the test's clock; tests run its rounds by hand instead of waiting for polls. */
  const dispatcher = (opts: { timeoutMs?: number; random?: () => number; resolve?: Resolver; allowLoopback?: boolean } = {}) => {
    const d = new WebhookDispatcher({
      storage: t.storage,
      policy: { allowHttpLoopback: opts.allowLoopback ?? true },
      timeoutMs: opts.timeoutMs ?? 2_000,
      maxConcurrency: 16,
      log: t.app.log,
      now: () => nowMs,
      random: opts.random ?? (() => 0.5),
      ...(opts.resolve ? { resolve: opts.resolve } : {}),
    });
    dispatchers.push(d);
    return d;
  };
  const round = async (d: WebhookDispatcher) => {
    await d.tick();
    await d.drain();
  };
  const api = (m: Merchant, method: 'GET' | 'POST' | 'PATCH', url: string, payload?: object) =>
    t.app.inject({ method, url, headers: t.auth(m.secretKey), ...(payload ? { payload } : {}) }).then((r) => r.json());
  const webhookFor = async (m: Merchant, url: string, events?: string[]) => api(m, 'POST', '/v1/webhooks', { name: 'test', url, ...(events ? { events } : {}) });
  const newCustomer = (m: Merchant, payload: object = {}) => api(m, 'POST', '/v1/customers', payload);
  const deliveries = async (m: Merchant, webhookId: string) => (await api(m, 'GET', `/v1/webhooks/${webhookId}/deliveries`)).data;

  beforeAll(() => {
    nowMs = t.clock.now();
  });

  it('delivers customer.created signed both ways: standardwebhooks and the documented hex check accept it, a tampered body fails both', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver();
    const hook = await webhookFor(m, r.url);
    const customer = await newCustomer(m, { email: 'ada@example.com' });
    await round(dispatcher());

    expect(r.received).toHaveLength(1);
    const got = r.received[0]!;
    const body = JSON.parse(got.body);
    expect(Object.keys(body)).toEqual(['id', 'event', 'created_at', 'data']);
    expect(body).toMatchObject({ event: 'customer.created', data: { customer_id: customer.customer_id } });
    expect(body.id).toMatch(/^evt_/);
    expect(got.headers['content-type']).toBe('application/json');
    expect(got.headers['webhook-id']).toBe(body.id);
    expect(standardVerify(hook.webhook_secret, got)).toEqual(body);
    expect(hexSignatureValid(hook.webhook_secret, got.body, got.headers['x-webhook-signature'] as string)).toBe(true);

    const tampered = { ...got, body: got.body.replace('ada@example.com', 'eve@example.com') };
    expect(() => standardVerify(hook.webhook_secret, tampered)).toThrow();
    expect(hexSignatureValid(hook.webhook_secret, tampered.body, got.headers['x-webhook-signature'] as string)).toBe(false);
    expect(() => standardVerify('whsec_' + Buffer.alloc(32, 1).toString('base64'), got)).toThrow();

    const [delivery] = await deliveries(m, hook.webhook_id);
    expect(delivery).toMatchObject({ event_id: body.id, event: 'customer.created', state: 'succeeded', attempts: 1, last_status_code: 200, next_attempt_at: null });
  });

  it('signs with the time of sending, so a receiver refuses a delivery whose timestamp is stale', async () => {
    nowMs = t.clock.now() - 10 * 60_000;
    const m = await t.newMerchant();
    const r = await receiver();
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    await round(dispatcher());
    const got = r.received[0]!;
    expect(Number(got.headers['webhook-timestamp'])).toBe(Math.floor(nowMs / 1000));
    expect(() => standardVerify(hook.webhook_secret, got)).toThrow(/too old/i);
  });

  it('retries a receiver answering 500 twice on schedule, then delivers on the third attempt with the same event id', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver((_req, _res, i) => (i < 2 ? 500 : 200));
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    const d = dispatcher({ random: () => 0.5 });
    await round(d);
    expect(r.received).toHaveLength(1);
    let [delivery] = await deliveries(m, hook.webhook_id);
    expect(delivery).toMatchObject({ state: 'pending', attempts: 1, last_status_code: 500 });
    expect(Date.parse(delivery.next_attempt_at) - nowMs).toBe(RETRY_DELAYS_MS[0]);

    nowMs += RETRY_DELAYS_MS[0] - 1;
    await round(d);
    expect(r.received).toHaveLength(1);
    nowMs += 1;
    await round(d);
    expect(r.received).toHaveLength(2);

    nowMs += RETRY_DELAYS_MS[1];
    await round(d);
    expect(r.received).toHaveLength(3);
    [delivery] = await deliveries(m, hook.webhook_id);
    expect(delivery).toMatchObject({ state: 'succeeded', attempts: 3, last_status_code: 200 });
    const ids = r.received.map((x) => JSON.parse(x.body).id);
    expect(new Set(ids).size).toBe(1);
    expect(new Set(r.received.map((x) => x.headers['webhook-id'])).size).toBe(1);
    for (const x of r.received) expect(hexSignatureValid(hook.webhook_secret, x.body, x.headers['x-webhook-signature'] as string)).toBe(true);
    // The run of failures ended with the success.
    expect((await api(m, 'GET', `/v1/webhooks/${hook.webhook_id}`)).failing_since).toBeNull();
  });

  it('follows the whole retry schedule with jitter, then marks the delivery failed', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver(() => 503);
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    const d = dispatcher({ random: () => 0 });
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      await round(d);
      expect(r.received).toHaveLength(attempt);
      const [delivery] = await deliveries(m, hook.webhook_id);
      if (attempt === MAX_ATTEMPTS) {
        expect(delivery).toMatchObject({ state: 'failed', attempts: MAX_ATTEMPTS, next_attempt_at: null, last_status_code: 503 });
        break;
      }
      // random() = 0 is the earliest the jitter allows: 10 % before the scheduled delay.
      const wait = Date.parse(delivery.next_attempt_at) - nowMs;
      expect(wait).toBe(Math.round(RETRY_DELAYS_MS[attempt - 1]! * 0.9));
      nowMs += wait;
    }
    nowMs += 30 * 24 * 3_600_000;
    await round(d);
    expect(r.received).toHaveLength(MAX_ATTEMPTS);
  });

  it('disables an endpoint that failed every attempt for 5 days, shows it, and PATCH enabled re-enables it', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver(() => 500);
    const hook = await webhookFor(m, r.url);
    const d = dispatcher();
    await newCustomer(m);
    await round(d);
    const failing = await api(m, 'GET', `/v1/webhooks/${hook.webhook_id}`);
    expect(failing).toMatchObject({ status: 'enabled', failing_since: new Date(nowMs).toISOString() });

    nowMs += 5 * 24 * 3_600_000 - 60_000;
    await newCustomer(m);
    await round(d);
    expect((await api(m, 'GET', `/v1/webhooks/${hook.webhook_id}`)).status).toBe('enabled');
    nowMs += 60_000;
    await newCustomer(m);
    await round(d);
    const disabled = await api(m, 'GET', `/v1/webhooks/${hook.webhook_id}`);
    expect(disabled).toMatchObject({ status: 'disabled', disabled_at: new Date(nowMs).toISOString() });

    // Disabled: new events make no deliveries, and the pending ones wait.
    const before = r.received.length;
    await newCustomer(m);
    nowMs += 24 * 3_600_000;
    await round(d);
    expect(await deliveries(m, hook.webhook_id)).toHaveLength(3);
    expect(r.received.length).toBe(before);

    const enabled = await api(m, 'PATCH', `/v1/webhooks/${hook.webhook_id}`, { enabled: true });
    expect(enabled).toMatchObject({ status: 'enabled', disabled_at: null, failing_since: null });
  });

  it('delivers the customer events under the older connection.* names to a webhook that chose them, and nothing it did not choose', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver();
    await webhookFor(m, r.url, ['connection.created']);
    const customer = await newCustomer(m);
    await t.app.inject({ method: 'DELETE', url: `/v1/customers/${customer.customer_id}`, headers: t.auth(m.secretKey) });
    await round(dispatcher());
    expect(r.received.map((x) => JSON.parse(x.body).event)).toEqual(['connection.created']);
    expect(JSON.parse(r.received[0]!.body).data.connection_id).toBe(customer.customer_id);
  });

  it('sends an event only to webhooks that existed when it happened, and only to its own merchant', async () => {
    nowMs = t.clock.now();
    const a = await t.newMerchant();
    const b = await t.newMerchant();
    const ra = await receiver();
    const rb = await receiver();
    await webhookFor(b, rb.url);
    await newCustomer(a);
    // The webhook comes a moment after the event (the app's clock stands still otherwise).
    t.clock.advance(1);
    await webhookFor(a, ra.url);
    await round(dispatcher());
    expect(ra.received).toHaveLength(0);
    expect(rb.received).toHaveLength(0);
  });

  it('writes nothing to the events of merchants without webhooks, nor to a merchant\'s events from before its first webhook', async () => {
    nowMs = t.clock.now();
    const without = await t.newMerchant();
    const later = await t.newMerchant();
    await newCustomer(without);
    await newCustomer(later);
    const r = await receiver();
    const d = dispatcher();
    await round(d);
    // The outbox's ids carry their time: a webhook made well after the old event (ids a minute apart) finds it below its bound.
    const old = await t.storage.db.selectFrom('events').select(['id']).where('merchant_id', '=', later.merchantId).executeTakeFirstOrThrow();
    await t.storage.db.updateTable('events').set({ id: 'evt_00000000000000000000000000' }).where('id', '=', old.id).execute();
    await webhookFor(later, r.url);
    const fresh = await newCustomer(later);
    await round(d);
    const marked = await t.storage.db
      .selectFrom('events')
      .select(['merchant_id', 'dispatched_at'])
      .where('merchant_id', 'in', [without.merchantId, later.merchantId])
      .execute();
    expect(marked.filter((e) => e.merchant_id === without.merchantId).map((e) => e.dispatched_at)).toEqual([null]);
    expect(marked.filter((e) => e.merchant_id === later.merchantId && e.dispatched_at === null)).toHaveLength(1);
    expect(r.received.map((x) => JSON.parse(x.body).data.customer_id)).toEqual([fresh.customer_id]);
  });

  it('redelivers a delivery on request with the same event id', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver();
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    const d = dispatcher();
    await round(d);
    const [delivery] = await deliveries(m, hook.webhook_id);
    const again = await api(m, 'POST', `/v1/webhooks/${hook.webhook_id}/deliveries/${delivery.delivery_id}/redeliver`);
    expect(again).toMatchObject({ delivery_id: delivery.delivery_id, state: 'pending', attempts: 0 });
    // The route schedules it at the wall clock's now; the dispatcher's clock catches up.
    nowMs = Math.max(nowMs, Date.parse(again.next_attempt_at));
    await round(d);
    expect(r.received).toHaveLength(2);
    expect(JSON.parse(r.received[1]!.body).id).toBe(delivery.event_id);
  });

  it('signs with both secrets during a rotation overlap, and with the new one only after it', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver();
    const hook = await webhookFor(m, r.url);
    const rotated = await api(m, 'POST', `/v1/webhooks/${hook.webhook_id}/rotate_secret`, { overlap_seconds: 600 });
    await newCustomer(m);
    const d = dispatcher();
    await round(d);
    const during = r.received[0]!;
    expect(standardVerify(hook.webhook_secret, during)).toBeTruthy();
    expect(standardVerify(rotated.webhook_secret, during)).toBeTruthy();
    expect(hexSignatureValid(rotated.webhook_secret, during.body, during.headers['x-webhook-signature'] as string)).toBe(true);
    expect(hexSignatureValid(hook.webhook_secret, during.body, during.headers['x-webhook-signature-previous'] as string)).toBe(true);

    nowMs += 601_000;
    await newCustomer(m);
    await round(d);
    const after = r.received[1]!;
    expect(after.headers['x-webhook-signature-previous']).toBeUndefined();
    expect(() => new Webhook(hook.webhook_secret).verify(after.body, { ...(after.headers as Record<string, string>) })).toThrow();
  });

  it('refuses to connect when the host resolves to loopback at delivery time (DNS rebinding), and never reaches it', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver();
    const port = new URL(r.url).port;
    // Saved while the name did not resolve; at delivery it answers with the receiver's loopback address.
    const hook = await webhookFor(m, `https://rebind.invalid:${port}/hooks`);
    await newCustomer(m);
    await round(dispatcher({ allowLoopback: false, resolve: async () => [{ address: '127.0.0.1', family: 4 }] }));
    expect(r.received).toHaveLength(0);
    const [delivery] = await deliveries(m, hook.webhook_id);
    expect(delivery).toMatchObject({ state: 'pending', attempts: 1, last_status_code: null, last_error: 'address_refused' });
  });

  it('refuses a webhook saved for loopback once the operator turns loopback off', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const r = await receiver();
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    await round(dispatcher({ allowLoopback: false }));
    expect(r.received).toHaveLength(0);
    expect((await deliveries(m, hook.webhook_id))[0]).toMatchObject({ last_error: 'url_refused' });
  });

  it('never follows a redirect: a 302 to loopback is a failed attempt and the target is never called', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const target = await receiver();
    const r = await receiver((_req, res) => {
      res.writeHead(302, { location: target.url }).end();
      return 'handled';
    });
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    await round(dispatcher());
    expect(r.received).toHaveLength(1);
    expect(target.received).toHaveLength(0);
    expect((await deliveries(m, hook.webhook_id))[0]).toMatchObject({ state: 'pending', last_status_code: 302 });
  });

  it('reads at most 64 KiB of a receiver answer and stops the rest', async () => {
    nowMs = t.clock.now();
    const m = await t.newMerchant();
    const total = 64 * 1024 * 1024;
    let written = 0;
    const r = await receiver((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const chunk = Buffer.alloc(64 * 1024, 97);
      const pump = () => {
        while (written < total && !res.destroyed) {
          written += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
        res.end();
      };
      res.on('close', () => undefined);
      pump();
      return 'handled';
    });
    const hook = await webhookFor(m, r.url);
    await newCustomer(m);
    await round(dispatcher());
    expect((await deliveries(m, hook.webhook_id))[0]).toMatchObject({ state: 'succeeded', last_status_code: 200 });
    expect(written).toBeLessThan(total);
  });

  it('keeps delivering to one merchant while another merchant’s receiver never answers', async () => {
    nowMs = t.clock.now();
    const slowMerchant = await t.newMerchant();
    const fastMerchant = await t.newMerchant();
    const hanging = await receiver(() => 'handled');
    const fast = await receiver();
    await webhookFor(slowMerchant, hanging.url);
    await webhookFor(fastMerchant, fast.url);
    for (let i = 0; i < 20; i++) await newCustomer(slowMerchant);
    const d = dispatcher({ timeoutMs: 1_000 });
    await d.tick();
    // Four sends hang on the dead endpoint; the other merchant's event goes out beside them.
    const started = performance.now();
    await newCustomer(fastMerchant);
    await d.tick();
    await fast.waitFor(1, 900);
    const lagMs = performance.now() - started;
    expect(hanging.received.length).toBeLessThanOrEqual(4);
    expect(lagMs).toBeLessThan(500);
    await d.drain();
  });
});

describe('webhook metrics', () => {
  it('counts attempts and successes and reports the queue lag in /metrics', async () => {
    const t = await startTestApp('sqlite', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
    const ok = await startReceiver();
    let nowMs = t.clock.now();
    const d = new WebhookDispatcher({
      storage: t.storage,
      policy: { allowHttpLoopback: true },
      timeoutMs: 1_000,
      maxConcurrency: 4,
      log: t.app.log,
      registry: t.app.metrics,
      now: () => nowMs,
    });
    try {
      await t.app.inject({ method: 'POST', url: '/v1/webhooks', headers: t.auth(), payload: { name: 'm', url: ok.url } });
      await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: {} });
      nowMs += 3_000;
      const before = (await t.app.inject({ method: 'GET', url: '/metrics' })).body;
      const lag = Number(/tollgate_webhook_queue_lag_seconds ([\d.]+)\n/.exec(before)?.[1]);
      expect(lag).toBeGreaterThan(2.5);
      expect(lag).toBeLessThanOrEqual(3);
      await d.tick();
      await d.drain();
      const text = (await t.app.inject({ method: 'GET', url: '/metrics' })).body;
      expect(text).toMatch(/tollgate_webhook_delivery_attempts_total 1\n/);
      expect(text).toMatch(/tollgate_webhook_deliveries_succeeded_total 1\n/);
      expect(text).toMatch(/tollgate_webhook_delivery_attempts_failed_total 0\n/);
      expect(text).toMatch(/tollgate_webhook_queue_lag_seconds 0\n/);
    } finally {
      await d.stop();
      await ok.close();
      await t.close();
    }
  });
});

describe('webhook delivery logs', () => {
  it('log a failed attempt by ids and status only: no URL, secret or customer detail', async () => {
    let text = '';
    const stream = new Writable({
      write(chunk, _enc, done) {
        text += chunk.toString();
        done();
      },
    });
    const t = await startTestApp('sqlite', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true', LOG_LEVEL: 'info' }, logStream: stream });
    const failing = await startReceiver(() => 500);
    const d = new WebhookDispatcher({ storage: t.storage, policy: { allowHttpLoopback: true }, timeoutMs: 1_000, maxConcurrency: 4, log: t.app.log });
    try {
      const url = `${failing.url}?token=receiver-token-123`;
      const hook = (await t.app.inject({ method: 'POST', url: '/v1/webhooks', headers: t.auth(), payload: { name: 'logs', url } })).json();
      await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: { email: 'private@example.com', name: 'Private Person' } });
      await d.tick();
      await d.drain();
      const attempt = text.split('\n').filter(Boolean).map((l) => JSON.parse(l)).find((l) => l.msg === 'webhook delivery attempt failed');
      expect(attempt).toMatchObject({ webhook_id: hook.webhook_id, attempt: 1, status: 500, state: 'pending' });
      for (const secret of [hook.webhook_secret, 'receiver-token-123', 'private@example.com', 'Private', failing.url]) expect(text).not.toContain(secret);
    } finally {
      await d.stop();
      await failing.close();
      await t.close();
    }
  });
});
