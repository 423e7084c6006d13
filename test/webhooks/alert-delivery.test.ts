import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { evaluateAlerts } from '../../src/services/alert-round.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { loopbackDispatcher, startReceiver, type Receiver } from '../helpers/webhook-receiver.ts';

describe.each(databasesUnderTest())('alert.triggered delivery on %s', (dialect) => {
  let t: TestApp;
  let receiver: Receiver;
  beforeAll(async () => {
    t = await startTestApp(dialect, { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
    receiver = await startReceiver();
  });
  afterAll(async () => {
    await receiver?.close();
    await t?.close();
  });

  it('delivers one alert.triggered per crossing to a webhook that chose it, signed with its secret', async () => {
    const m = await t.newMerchant();
    const api = (method: 'POST' | 'GET', url: string, payload?: object) => t.app.inject({ method, url, headers: t.auth(m.secretKey), ...(payload ? { payload } : {}) }).then((r) => r.json());
    const hook = await api('POST', '/v1/webhooks', { name: 'alerts', url: receiver.url, events: ['alert.triggered'] });
    const c = await t.customerWithMeter({ credit: '1', secretKey: m.secretKey });
    const rule = await api('POST', '/v1/alerts', { kind: 'low_balance', customer_id: c.customerId, threshold: '0.8' });
    await api('POST', '/v1/requests', { request_id: 'r-1', customer_id: c.customerId, meter_slug: c.meterSlug });

    const dispatcher = loopbackDispatcher(t);
    try {
      await evaluateAlerts({ storage: t.storage, clock: t.clock }, dateOf(t.clock));
      await evaluateAlerts({ storage: t.storage, clock: t.clock }, dateOf(t.clock));
      await dispatcher.tick();
      await dispatcher.drain();
    } finally {
      await dispatcher.stop();
    }

    expect(receiver.received).toHaveLength(1);
    const got = receiver.received[0]!;
    const body = new Webhook(hook.webhook_secret).verify(got.body, got.headers as Record<string, string>);
    expect(body).toMatchObject({
      event: 'alert.triggered',
      created_at: dateOf(t.clock).toISOString(),
      data: { alert_id: rule.alert_id, kind: 'low_balance', customer_id: c.customerId, threshold: '0.8000000000', balance: '0.7500000000' },
    });
    const firings = await api('GET', `/v1/alerts/${rule.alert_id}/firings`);
    expect(firings.data.map((f: { event_id: string }) => f.event_id)).toEqual([(body as { id: string }).id]);
  });
});
