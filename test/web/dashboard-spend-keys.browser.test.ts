import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { exactText, signedInDashboard, type DashboardSession } from '../helpers/dashboard.ts';
import { until } from '../helpers/until.ts';

type Key = { spend_key_id: string; name: string; key_preview: string; status: string; current_spend: string; current_requests: number; total_requests: number };

/**
 * Spend keys from the dashboard in real Chromium: created with limits (the key shown once), used
 * through the gateway, its counters on the page equal to the API's, paused, resumed and rotated —
 * each change proved by what the gateway then does with the key.
 */
describe('dashboard spend keys (Chromium)', () => {
  let d: DashboardSession;
  let key: string;
  let keyId: string;

  beforeAll(async () => {
    d = await signedInDashboard('spend@shop.example', { gateway: { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-openai-managed' } } });
    await creditWallet(d.t.storage, d.walletId, parseMoney('20'), new Date().toISOString());
  });
  afterAll(async () => {
    await d?.close();
  });

  const chat = (k: string) =>
    fetch(`${d.base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${k}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'hello there' }] }),
    });
  const keysOverApi = async () => (await d.api('GET', '/v1/spend_keys?limit=100')).body.data as Key[];
  /** Settlement runs after the answer: wait until the key has counted `requests` and holds no reservation. */
  function settled(requests: number): Promise<Key> {
    return until(async () => {
      const inFlight = await d.t.storage.db.selectFrom('spend_key_reservations').select('request_pk').where('spend_key_id', '=', keyId).execute();
      const found = (await keysOverApi()).find((k) => k.spend_key_id === keyId)!;
      return found.total_requests === requests && inFlight.length === 0 && found;
    }, `the spend key to settle ${requests} requests`);
  }
  const cell = (selector: string) => exactText(d.page, `#key-${keyId} ${selector}`);
  const clickRowButton = async (name: RegExp) => {
    await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name }).click()]);
  };

  it('says how to create a first spend key when there is none', async () => {
    await d.visit('/dashboard/spend-keys', 'spend-keys-empty');
    expect(await d.page.textContent('main')).toContain('No spend keys yet');
  });

  it('refuses a form with a bad limit, saying which, and creates nothing', async () => {
    await d.page.getByLabel('Spend limit', { exact: true }).fill('five dollars');
    await d.page.getByLabel('Request limit', { exact: true }).fill('2.5');
    await clickRowButton(/^Create spend key$/);
    const error = await d.page.textContent('#spend-key-error');
    expect(error).toContain('Spend limit');
    expect(error).toContain('Request limit');
    expect(await keysOverApi()).toEqual([]);
    const noToken = await d.page.request.post(`${d.base}/dashboard/spend-keys`, { form: { name: 'sneaky' }, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);
    expect(await keysOverApi()).toEqual([]);
  });

  it('creates a key with limits and shows it once; the key works and its counters match the API', async () => {
    await d.page.goto(`${d.base}/dashboard/spend-keys`);
    await d.page.getByLabel('Name').fill('Team A');
    await d.page.getByLabel('Spend limit', { exact: true }).fill('5.00');
    await d.page.getByLabel('Spend limit resets').selectOption('daily');
    await d.page.getByLabel('Request limit', { exact: true }).fill('100');
    await d.page.getByLabel('Request limit resets').selectOption('daily');
    await d.page.getByLabel('Requests per minute').fill('60');
    await clickRowButton(/^Create spend key$/);
    key = (await d.page.textContent('#new-spend-key'))!.trim();
    expect(key).toMatch(/^spk_live_/);
    const [created] = await keysOverApi();
    keyId = created!.spend_key_id;
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).body).toMatchObject({
      name: 'Team A',
      spend_limit: { amount: '5.0000000000', cycle: 'daily' },
      request_limit: { count: 100, cycle: 'daily' },
      rate_limit: { rpm: 60, burst: null },
    });

    expect((await chat(key)).status).toBe(200);
    expect((await chat(key)).status).toBe(200);
    const used = await settled(2);
    expect(parseMoney(used.current_spend)).toBeGreaterThan(0n);
    await d.visit('/dashboard/spend-keys', 'spend-keys');
    expect(await d.page.content()).not.toContain(key);
    expect(await cell('.spend')).toBe(`${used.current_spend} of 5.0000000000 (daily)`);
    expect(await cell('.requests')).toBe('2 of 100 (daily)');
  });

  it('pauses and resumes the key: the gateway refuses it while paused', async () => {
    await clickRowButton(/^Pause Team A/);
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).body.status).toBe('paused');
    d.t.clock.advance(3_000); // past the gateway's credential cache
    const refused = await chat(key);
    expect(refused.status).toBe(403);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('spend_key_paused');
    expect(await d.page.textContent('#spend-key-message')).toContain('paused');

    await clickRowButton(/^Resume Team A/);
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).body.status).toBe('active');
    d.t.clock.advance(3_000);
    expect((await chat(key)).status).toBe(200);
    await settled(3);
  });

  it('rotates the key: the new key is shown once and works, the old one stops', async () => {
    const before = (await d.api('GET', `/v1/spend_keys/${keyId}`)).body.key_preview;
    await d.page.getByRole('link', { name: /^Rotate Team A/ }).click();
    await d.page.waitForURL((u) => u.pathname === `/dashboard/spend-keys/${keyId}/rotate`);
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).body.key_preview).toBe(before);
    await clickRowButton(/^Rotate the key$/);
    const rotated = (await d.page.textContent('#new-spend-key'))!.trim();
    expect(rotated).toMatch(/^spk_live_/);
    expect(rotated).not.toBe(key);
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).body.key_preview).not.toBe(before);
    d.t.clock.advance(3_000);
    expect((await chat(key)).status).toBe(401);
    expect((await chat(rotated)).status).toBe(200);
    await settled(4);
    await d.page.goto(`${d.base}/dashboard/spend-keys`);
    expect(await d.page.content()).not.toContain(rotated);
    expect(await cell('.requests')).toBe('4 of 100 (daily)');
  });

  it("changes a key's limits on its page: the API sees them, the counters stay the API's", async () => {
    await d.page.goto(`${d.base}/dashboard/spend-keys`);
    await d.page.getByRole('link', { name: 'Team A', exact: true }).click();
    await d.page.waitForURL((u) => u.pathname === `/dashboard/spend-keys/${keyId}`);
    await d.visit(`/dashboard/spend-keys/${keyId}`, 'spend-key');
    const api = (await d.api('GET', `/v1/spend_keys/${keyId}`)).body;
    expect(await d.page.textContent('#current-requests')).toBe(`${api.current_requests} of 100 (daily)`);
    expect(await exactText(d.page, '#current-spend')).toBe(`${api.current_spend} of 5.0000000000 (daily)`);

    await d.page.getByLabel('Spend limit', { exact: true }).fill('-1');
    await clickRowButton(/^Save limits$/);
    expect(await d.page.textContent('#spend-key-error')).toContain('Spend limit');
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).body.spend_limit).toEqual({ amount: '5.0000000000', cycle: 'daily' });

    await d.page.getByLabel('Spend limit', { exact: true }).fill('7.5');
    await d.page.getByLabel('Spend limit resets').selectOption('weekly');
    await d.page.getByLabel('Request limit', { exact: true }).fill('');
    await clickRowButton(/^Save limits$/);
    await d.page.waitForSelector('#limits-saved');
    const after = (await d.api('GET', `/v1/spend_keys/${keyId}`)).body;
    expect(after).toMatchObject({ spend_limit: { amount: '7.5000000000', cycle: 'weekly' }, request_limit: null, rate_limit: { rpm: 60 } });
    expect(await exactText(d.page, '#current-spend')).toBe(`${after.current_spend} of 7.5000000000 (weekly)`);
    expect(await d.page.textContent('#current-requests')).toBe(`${after.current_requests} (no limit)`);
  });

  it('revokes a key only after its confirmation page, which works without JavaScript, and offers the actions on the key\'s own page', async () => {
    const noScript = await d.browser.newContext({ javaScriptEnabled: false });
    await noScript.addCookies(await d.context.cookies());
    const page = await noScript.newPage();
    await page.goto(`${d.base}/dashboard/spend-keys/${keyId}`);
    expect(await page.getByRole('link', { name: /^Revoke Team A/ }).count()).toBe(1);
    await page.getByRole('link', { name: /^Revoke Team A/ }).click();
    await page.waitForURL((u) => u.pathname === `/dashboard/spend-keys/${keyId}/revoke`);
    expect(await page.textContent('h1')).toBe('Revoke the spend key Team A?');
    await page.getByRole('link', { name: 'Go back' }).click();
    await page.waitForURL((u) => u.pathname === '/dashboard/spend-keys');
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).status).toBe(200);

    await page.getByRole('link', { name: /^Revoke Team A/ }).click();
    await page.getByRole('button', { name: 'Revoke the key' }).click();
    await page.waitForSelector('#spend-key-message');
    expect(await page.textContent('#spend-key-message')).toContain('revoked');
    expect((await d.api('GET', `/v1/spend_keys/${keyId}`)).status).toBe(404);
    await noScript.close();
  });
});
