import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { evaluateAlerts } from '../../src/services/alert-round.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { TestClock } from '../helpers/clock.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';
import { OpenApiResponses, servedDocument } from '../helpers/openapi-responses.ts';
import { until } from '../helpers/until.ts';

type Json = Record<string, unknown>;
const DAY_MS = 86_400_000;

describe.each(databasesUnderTest())('alert rules on %s', (dialect) => {
  let t: TestApp;
  let upstream: MockUpstream;
  let openapi: OpenApiResponses;
  // Noon UTC, so a test's requests stay inside one UTC day until it moves the clock a day on.
  const clock = new TestClock(Date.parse('2026-11-29T12:00:00.000Z'));

  beforeAll(async () => {
    upstream = await startMockUpstream();
    t = await startTestApp(dialect, {
      clock,
      env: { UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }), PROVIDER_KEYS: JSON.stringify({ openai: 'sk-openai-managed' }) },
    });
    openapi = new OpenApiResponses(await servedDocument(t.app));
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
    expect(openapi.problems).toEqual([]);
  });

  /** An API call whose answer is held against the served OpenAPI document. */
  const api = async (key: string, method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: Json) => {
    const res = await t.app.inject({ method, url, headers: t.auth(key), ...(payload ? { payload } : {}) });
    expect(openapi.check({ method, url, status: res.statusCode, contentType: String(res.headers['content-type'] ?? ''), body: res.body })).toEqual([]);
    return res;
  };
  /** Runs a round (over every merchant's rules) and counts the merchant's alert events after it. */
  const round = async (merchantId: string) => {
    await evaluateAlerts({ storage: t.storage, clock }, dateOf(clock));
    return (await alertEvents(merchantId)).length;
  };
  const stateOf = async (key: string, id: string) => (await api(key, 'GET', `/v1/alerts/${id}`)).json().state as string;
  const alertEvents = async (merchantId: string) =>
    (await t.storage.db.selectFrom('events').selectAll().where('merchant_id', '=', merchantId).where('type', '=', 'alert.triggered').orderBy('id').execute()).map(
      (e) => JSON.parse(e.payload) as Json,
    );
  /** A merchant and a customer holding `credit`, charged 0.25 per recorded request. */
  const world = async (credit: string) => {
    const m = await t.newMerchant();
    const c = await t.customerWithMeter({ credit, secretKey: m.secretKey });
    let n = 0;
    const charge = async (times: number) => {
      for (let i = 0; i < times; i++) {
        const res = await api(m.secretKey, 'POST', '/v1/requests', { request_id: `r-${c.customerId}-${n++}`, customer_id: c.customerId, meter_slug: c.meterSlug });
        expect(res.statusCode).toBe(201);
      }
    };
    return { m, c, charge };
  };

  it('creates, lists, retrieves, changes and deletes a rule, each answer as documented', async () => {
    const { m, c } = await world('1');
    const created = await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'spend_threshold', customer_id: c.customerId, threshold: '12.5', period: 'month' });
    expect(created.statusCode).toBe(201);
    const alert = created.json();
    expect(alert).toMatchObject({ kind: 'spend_threshold', customer_id: c.customerId, spend_key_id: null, threshold: '12.5000000000', period: 'month', enabled: true, state: 'armed', triggered_at: null });
    expect(alert.alert_id).toMatch(/^alr_/);
    expect((await api(m.secretKey, 'GET', '/v1/alerts')).json()).toMatchObject({ data: [alert], has_more: false, next_cursor: null });
    expect((await api(m.secretKey, 'GET', `/v1/alerts/${alert.alert_id}`)).json()).toEqual(alert);
    const changed = await api(m.secretKey, 'PATCH', `/v1/alerts/${alert.alert_id}`, { threshold: '20', period: 'day', enabled: false });
    expect(changed.json()).toMatchObject({ threshold: '20.0000000000', period: 'day', enabled: false });
    expect((await api(m.secretKey, 'DELETE', `/v1/alerts/${alert.alert_id}`)).json()).toEqual({ id: alert.alert_id, deleted: true });
    expect((await api(m.secretKey, 'GET', `/v1/alerts/${alert.alert_id}`)).statusCode).toBe(404);
    // Another merchant sees none of it.
    const other = await t.newMerchant();
    const kept = (await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'low_balance', customer_id: c.customerId, threshold: '1' })).json();
    expect((await api(other.secretKey, 'GET', `/v1/alerts/${kept.alert_id}`)).statusCode).toBe(404);
    expect((await api(other.secretKey, 'GET', '/v1/alerts')).json().data).toEqual([]);
  });

  it('refuses bad input with 400 and the issues, creating nothing', async () => {
    const { m, c } = await world('1');
    const refused: [Json, string[]][] = [
      [{ kind: 'low_balance', threshold: '5' }, ['customer_id']],
      [{ kind: 'low_balance', customer_id: c.customerId, threshold: '5', period: 'day' }, ['period']],
      [{ kind: 'spend_threshold', customer_id: c.customerId, threshold: '5' }, ['period']],
      [{ kind: 'spend_threshold', threshold: '5', period: 'day' }, ['customer_id']],
      [{ kind: 'low_balance', customer_id: c.customerId, threshold: 'five' }, ['threshold']],
      [{ kind: 'low_balance', customer_id: c.customerId, threshold: '0' }, ['threshold']],
      [{ kind: 'low_balance', customer_id: c.customerId, threshold: 5 }, ['threshold']],
      [{ kind: 'weather', customer_id: c.customerId, threshold: '5' }, ['kind']],
      [{ kind: 'low_balance', customer_id: c.customerId, threshold: '5', thresold: '6' }, []],
      [{ kind: 'low_balance', customer_id: 'con_nobody', threshold: '5' }, ['customer_id']],
      [{ kind: 'spend_threshold', spend_key_id: 'spk_nobody', threshold: '5', period: 'total' }, ['spend_key_id']],
    ];
    for (const [body, paths] of refused) {
      const res = await api(m.secretKey, 'POST', '/v1/alerts', body);
      expect(res.statusCode, JSON.stringify(body)).toBe(400);
      const error = res.json().error;
      expect(error.code).toBe('validation_error');
      expect(error.issues.length).toBeGreaterThan(0);
      for (const path of paths) expect(error.issues.map((i: { path: string[] }) => i.path[0])).toContain(path);
    }
    const rule = (await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'low_balance', customer_id: c.customerId, threshold: '5' })).json();
    const patched = await api(m.secretKey, 'PATCH', `/v1/alerts/${rule.alert_id}`, { period: 'day' });
    expect(patched.statusCode).toBe(400);
    expect(patched.json().error.issues[0].path).toEqual(['period']);
    expect((await api(m.secretKey, 'GET', '/v1/alerts')).json().data).toHaveLength(1);
  });

  it('fires a low balance exactly once, and again only after the balance recovered', async () => {
    const { m, c, charge } = await world('1');
    const rule = (await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'low_balance', customer_id: c.customerId, threshold: '0.6' })).json();
    await charge(1);
    expect(await round(m.merchantId)).toBe(0);
    await charge(1);
    expect(await round(m.merchantId)).toBe(1);
    await charge(1);
    expect(await round(m.merchantId)).toBe(1);
    expect((await api(m.secretKey, 'GET', `/v1/alerts/${rule.alert_id}`)).json()).toMatchObject({ state: 'triggered', triggered_at: dateOf(clock).toISOString() });
    expect(await alertEvents(m.merchantId)).toEqual([
      { alert_id: rule.alert_id, kind: 'low_balance', customer_id: c.customerId, spend_key_id: null, threshold: '0.6000000000', period: null, period_start: null, balance: '0.5000000000' },
    ]);

    await creditWallet(t.storage, c.walletId, parseMoney('1'), dateOf(clock).toISOString());
    expect(await round(m.merchantId)).toBe(1);
    expect(await stateOf(m.secretKey, rule.alert_id)).toBe('armed');
    await charge(3);
    expect(await round(m.merchantId)).toBe(2);
    const events = await alertEvents(m.merchantId);
    expect(events.map((e) => e.balance)).toEqual(['0.5000000000', '0.5000000000']);
    const firings = (await api(m.secretKey, 'GET', `/v1/alerts/${rule.alert_id}/firings`)).json();
    expect(firings.data.map((f: Json) => f.value)).toEqual(['0.5000000000', '0.5000000000']);
    const eventIds = (await t.storage.db.selectFrom('events').select('id').where('type', '=', 'alert.triggered').where('merchant_id', '=', m.merchantId).orderBy('id', 'desc').execute()).map((e) => e.id);
    expect(firings.data.map((f: Json) => f.event_id)).toEqual(eventIds);
  });

  it("fires a customer's daily spend once per UTC day it is reached", async () => {
    const { m, c, charge } = await world('10');
    const rule = (await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'spend_threshold', customer_id: c.customerId, threshold: '0.5', period: 'day' })).json();
    await charge(1);
    expect(await round(m.merchantId)).toBe(0);
    await charge(1);
    expect(await round(m.merchantId)).toBe(1);
    expect(await stateOf(m.secretKey, rule.alert_id)).toBe('triggered');
    await charge(2);
    expect(await round(m.merchantId)).toBe(1);

    clock.advance(DAY_MS);
    expect(await stateOf(m.secretKey, rule.alert_id)).toBe('armed');
    await charge(1);
    expect(await round(m.merchantId)).toBe(1);
    await charge(1);
    expect(await round(m.merchantId)).toBe(2);
    const events = await alertEvents(m.merchantId);
    expect(events.map((e) => [e.spend, e.period_start])).toEqual([
      ['0.5000000000', '2026-11-29T00:00:00.000Z'],
      ['0.5000000000', new Date(Math.floor(clock.now() / DAY_MS) * DAY_MS).toISOString()],
    ]);
  });

  it('a disabled rule fires nothing; enabling it re-arms it and the next round fires', async () => {
    const { m, c, charge } = await world('1');
    const rule = (await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'low_balance', customer_id: c.customerId, threshold: '0.9', enabled: false })).json();
    await charge(1);
    expect(await round(m.merchantId)).toBe(0);
    expect(await stateOf(m.secretKey, rule.alert_id)).toBe('armed');
    await api(m.secretKey, 'PATCH', `/v1/alerts/${rule.alert_id}`, { enabled: true });
    expect(await round(m.merchantId)).toBe(1);
    // Raising the threshold re-arms it too: the crossing of the new threshold is reported.
    await api(m.secretKey, 'PATCH', `/v1/alerts/${rule.alert_id}`, { threshold: '0.95' });
    expect(await round(m.merchantId)).toBe(2);
    expect((await alertEvents(m.merchantId)).map((e) => e.threshold)).toEqual(['0.9000000000', '0.9500000000']);
  });

  it("fires a spend key's total spend once, from the key's own counter", async () => {
    const m = await t.newMerchant();
    await creditWallet(t.storage, m.walletId, parseMoney('100'), dateOf(clock).toISOString());
    const key = (await api(m.secretKey, 'POST', '/v1/spend_keys', { name: 'team' })).json();
    const chat = async () => {
      const base = await listening();
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(res.status).toBe(200);
      await res.text();
    };
    await chat();
    const spent = await settledSpend(m.secretKey, key.spend_key_id, 0n);
    // The threshold is what two calls cost: the first call alone stays below it.
    const rule = (await api(m.secretKey, 'POST', '/v1/alerts', { kind: 'spend_threshold', spend_key_id: key.spend_key_id, threshold: formatMoney(spent * 2n), period: 'total' })).json();
    expect(await round(m.merchantId)).toBe(0);
    await chat();
    await settledSpend(m.secretKey, key.spend_key_id, spent);
    expect(await round(m.merchantId)).toBe(1);
    await chat();
    await settledSpend(m.secretKey, key.spend_key_id, spent * 2n);
    expect(await round(m.merchantId)).toBe(1);
    const events = await alertEvents(m.merchantId);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ alert_id: rule.alert_id, kind: 'spend_threshold', spend_key_id: key.spend_key_id, customer_id: null, period: 'total', spend: formatMoney(spent * 2n) });
  });

  let base: string | undefined;
  const listening = async () => (base ??= await t.listen());
  /** The key's total_spend once it is above `above` (settlement runs after the answer). */
  const settledSpend = async (secretKey: string, id: string, above: bigint): Promise<bigint> => {
    return until(
      async () => {
        const spend = parseMoney((await api(secretKey, 'GET', `/v1/spend_keys/${id}`)).json().total_spend as string);
        return spend > above ? spend : undefined;
      },
      'the spend key to have its call settled',
      { timeoutMs: 5_000, intervalMs: 20 },
    );
  };
});
