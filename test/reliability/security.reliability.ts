import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import type { MockGateway } from '../helpers/gateway.ts';
import { leaksInSuiteLogs, printFigures, startSuiteGateway } from './harness.ts';

/**
 * Security sweep over every operation in the OpenAPI document: without a key every one is 401;
 * with another merchant's key none reaches the first merchant's resources (no 2xx on them, and no
 * answer shows their ids); with a spend key where a secret key is required, 401 or 403. The logs of
 * the sweep hold no secret, key or e-mail address.
 */

// POST /v1/auth/callback takes no key by the interface: its one-time code is the credential. The
// OpenAI-shaped model list answers without a key, as the reference service's does (a key sent must
// still be valid, which the gateway tests prove).
const PUBLIC = new Set(['GET /healthz', 'GET /readyz', 'GET /v1/openapi.json', 'POST /v1/auth/callback', 'GET /v1/models', 'GET /v1/models/{model}']);
/** Where a spend key is a valid credential (it is a drop-in provider key). */
const REWRITE_PATH = '/v1/rewrite/{format}/{providerUrl}';
const GATEWAY_PATHS = ['/v1/forward', '/v1/chat/completions', '/v1/responses', '/v1/embeddings', '/v1/models', '/v1/messages', '/v1/messages/count_tokens', REWRITE_PATH];
/**
 * Gemini's native drop-in (`/v1beta/models/{model}:generateContent`, …), which answers in Google's
 * dialect, and the model reads every drop-in client makes (`/v1/models/{model}`, Gemini's
 * `/v1beta/models` and `/v1beta/models/{model}`), which show a spend key what it may use.
 */
const isGatewayPath = (path: string) => GATEWAY_PATHS.includes(path) || /^\/v1(beta)?\/models(\/\{model\}(:.*)?)?$/.test(path);
/** The interface's code; in Google's dialect (whose `code` is the HTTP status) the ErrorInfo reason. */
const interfaceCode = (text: string): unknown => {
  const error = JSON.parse(text).error;
  return typeof error?.code === 'number' ? error.details?.[0]?.reason : error?.code;
};

type Operation = { method: string; path: string };
type Answer = { status: number; text: string };

describe.each(databasesUnderTest())('security sweep on %s', (dialect) => {
  let gw: MockGateway;
  let operations: Operation[];
  const a: Record<string, string> = {};
  let otherKey: string;
  let spendKey: string;
  const email = `owner.${dialect}@customer.example`;

  beforeAll(async () => {
    gw = await startSuiteGateway(dialect);
    const { t } = gw;
    const doc = (await t.app.inject({ method: 'GET', url: '/v1/openapi.json' })).json() as { paths: Record<string, Record<string, unknown>> };
    operations = Object.entries(doc.paths).flatMap(([path, methods]) => Object.keys(methods).map((m) => ({ method: m.toUpperCase(), path })));
    const post = async (url: string, payload: object) => {
      const res = await t.app.inject({ method: 'POST', url, headers: t.auth(), payload });
      expect(res.statusCode, `${url}: ${res.body}`).toBeLessThan(300);
      return res.json();
    };
    const customer = await post('/v1/customers', { name: 'Owner', email });
    a.customer = customer.customer_id;
    a.wallet = customer.wallet.wallet_id;
    const meter = await post('/v1/meters', { name: 'Owner meter', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0' }] });
    a.meter = meter.meter_id;
    a.meterSlug = meter.meter_slug;
    const created = await post('/v1/spend_keys', { name: 'Owner spend key' });
    a.spendKey = created.spend_key_id;
    spendKey = created.key;
    a.walletKey = (await post('/v1/wallet_keys', { customer_id: a.customer })).wallet_key_id;
    a.record = (await post('/v1/requests', { request_id: `sweep-${dialect}`, customer_id: a.customer, meter_slug: a.meterSlug })).id;
    a.secretKey = (await t.app.inject({ method: 'GET', url: '/v1/secret_keys', headers: t.auth() })).json().data[0].secret_key_id;
    otherKey = (await t.newMerchant('Stranger')).secretKey;
  });
  afterAll(async () => {
    await gw?.t.close();
    await gw?.upstream.close();
  });

  /** The first merchant's id for a path parameter, by the resource the path names. */
  const idFor = (path: string): string => {
    const table: [string, string][] = [
      ['/v1/customers/', a.customer!], ['/v1/connections/', a.customer!], ['/v1/meters/', a.meter!], ['/spend_keys/', a.spendKey!],
      ['/v1/wallet_keys/', a.walletKey!], ['/v1/secret_keys/', a.secretKey!], ['/v1/requests/', a.record!],
    ];
    return table.find(([prefix]) => path.includes(prefix))?.[1] ?? 'unknown_00000000000000000000000000';
  };
  const urlOf = (op: Operation) => {
    // A rewrite names a real format and provider, so the credential check is what answers.
    if (op.path === REWRITE_PATH) return '/v1/rewrite/openai/https://api.openai.com/v1/chat/completions';
    const path = op.path.replace(/\{[^}]+\}/g, () => idFor(op.path));
    return op.path === '/v1/forward' ? `${path}?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}` : path;
  };
  /** A body that names the first merchant's customer, meter and wallet wherever a field takes one. */
  const bodyOf = () => ({
    request_id: `stranger-${Math.random()}`, customer_id: a.customer, connection_id: a.customer, meter_slug: a.meterSlug, meter_id: a.meter,
    wallet_id: a.wallet, name: 'x', amount: '1', model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1,
  });
  const call = async (op: Operation, headers: Record<string, string>): Promise<Answer> => {
    const hasBody = op.method !== 'GET' && op.method !== 'DELETE';
    const res = await gw.t.app.inject({
      method: op.method as 'GET',
      url: urlOf(op),
      headers: { ...headers, ...(hasBody ? { 'content-type': 'application/json' } : {}) },
      ...(hasBody ? { payload: JSON.stringify(bodyOf()) } : {}),
    });
    return { status: res.statusCode, text: res.body };
  };

  it('refuses every operation without a key, with a stranger key on the owner\'s resources, and with a spend key where a secret key is required', async () => {
    const failures: string[] = [];
    let checks = 0;
    const guarded = operations.filter((op) => !PUBLIC.has(`${op.method} ${op.path}`));
    for (const op of guarded) {
      checks++;
      const anonymous = await call(op, {});
      if (anonymous.status !== 401 || interfaceCode(anonymous.text) !== 'unauthorized') failures.push(`no key: ${op.method} ${op.path} -> ${anonymous.status}`);
    }
    const ownerIds = Object.entries(a).filter(([name]) => name !== 'meterSlug').map(([, id]) => id);
    for (const op of guarded) {
      if (op.path === '/v1/forward' || isGatewayPath(op.path)) continue;
      checks++;
      const stranger = await call(op, { authorization: `Bearer ${otherKey}` });
      const namesOwner = op.path.includes('{');
      if (stranger.status >= 500) failures.push(`stranger: ${op.method} ${op.path} -> ${stranger.status}`);
      if (namesOwner && stranger.status < 300) failures.push(`stranger reached the owner's resource: ${op.method} ${op.path} -> ${stranger.status}`);
      const shown = ownerIds.filter((id) => stranger.status < 300 && stranger.text.includes(id));
      if (shown.length > 0) failures.push(`stranger saw the owner's ${shown.join(', ')}: ${op.method} ${op.path}`);
      if (stranger.status < 300 && stranger.text.includes(email)) failures.push(`stranger saw the owner's e-mail: ${op.method} ${op.path}`);
    }
    for (const op of guarded) {
      if (isGatewayPath(op.path)) continue;
      checks++;
      const withSpendKey = await call(op, { authorization: `Bearer ${spendKey}` });
      if (![401, 403].includes(withSpendKey.status)) failures.push(`spend key: ${op.method} ${op.path} -> ${withSpendKey.status}`);
    }
    // Credentials in query parameters of any name are logged masked (finding 7).
    for (const query of [`api_key=${otherKey}`, `access_token=${spendKey}`, `u=${encodeURIComponent(`https://api.openai.com/v1/models?key=${otherKey}`)}`]) {
      checks++;
      await gw.t.app.inject({ method: 'GET', url: `/v1/customers?${query}`, headers: gw.t.auth() });
    }
    const logs = leaksInSuiteLogs([spendKey, otherKey, gw.t.merchant.secretKey, email]);
    printFigures(`security (${dialect})`, { operations: guarded.length, checks, refusals_missing: failures.length, log_lines: logs.lines, log_leaks: logs.leaks.length });
    expect(failures).toEqual([]);
    expect(logs.lines, 'the sweep was logged').toBeGreaterThan(checks);
    expect(logs.leaks).toEqual([]);
  });
});
