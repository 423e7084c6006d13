import { describe, expect, it } from 'vitest';
import { useSignedInDashboard } from '../helpers/dashboard.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

/**
 * Secret keys from the dashboard in real Chromium: a key created (shown once), rotated (the new
 * secret shown once, the old one refused at once) and revoked (refused from then on), each step
 * proved by calling the API over loopback with the key itself; every API answer is held against
 * the served OpenAPI document.
 */
describe('dashboard secret keys (Chromium)', () => {
  const d = useSignedInDashboard('keys@shop.example');
  checkResponsesAgainstOpenApi(() => d.t);

  /** An API call over real HTTP with `key`: its status and JSON. */
  const call = async (key: string, method: string, path: string) => {
    const res = await fetch(`${d.base}${path}`, { method, headers: { authorization: `Bearer ${key}` } });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  const submit = async (name: string) => {
    const [response] = await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name, exact: true }).click()]);
    return response.status();
  };
  let deployKey = '';
  let deployId = '';

  it('refuses a blank name under the field, in plain words, and creates nothing', async () => {
    await d.visit('/dashboard/secret-keys', 'secret-keys');
    await d.page.getByLabel('Name').fill('   ');
    expect(await submit('Create secret key')).toBe(400);
    expect(await d.page.textContent('#key-name-error')).toBe('Name is required.');
    expect(await d.page.getAttribute('#key-name', 'aria-invalid')).toBe('true');
    expect((await call(d.secretKey, 'GET', '/v1/secret_keys')).body.data).toHaveLength(1);
  });

  it('creates a key shown once, and the key works', async () => {
    await d.page.getByLabel('Name').fill('Deploy');
    expect(await submit('Create secret key')).toBe(201);
    deployKey = (await d.page.textContent('#new-secret-key'))!.trim();
    expect(deployKey).toMatch(/^sk_live_/);
    const listed = (await call(deployKey, 'GET', '/v1/secret_keys')).body.data as { secret_key_id: string; name: string }[];
    deployId = listed.find((k) => k.name === 'Deploy')!.secret_key_id;
    await d.page.goto(`${d.base}/dashboard/secret-keys`);
    expect(await d.page.content()).not.toContain(deployKey);
  });

  it('rotates a key after asking: the new secret is shown once and works, the old one is refused at once', async () => {
    await d.page.getByRole('link', { name: /^Rotate Deploy/ }).click();
    await d.visit(`/dashboard/secret-keys/${deployId}/rotate`, 'secret-key-rotate');
    expect(await d.page.textContent('h1')).toBe('Rotate the secret key Deploy?');
    expect(await submit('Rotate the key')).toBe(200);
    const rotated = (await d.page.textContent('#new-secret-key'))!.trim();
    expect(rotated).toMatch(/^sk_live_/);
    expect(rotated).not.toBe(deployKey);
    expect((await call(deployKey, 'GET', '/v1/secret_keys')).status).toBe(401);
    const listed = (await call(rotated, 'GET', '/v1/secret_keys')).body.data as { secret_key_id: string; name: string }[];
    expect(listed.filter((k) => k.secret_key_id === deployId)).toHaveLength(1);
    deployKey = rotated;
  });

  it('the API rotates too, with the same operation: POST /v1/secret_keys/{id}/rotate', async () => {
    const { status, body } = await call(d.secretKey, 'POST', `/v1/secret_keys/${deployId}/rotate`);
    expect(status).toBe(200);
    expect(body).toMatchObject({ secret_key_id: deployId, name: 'Deploy' });
    expect((await call(deployKey, 'GET', '/v1/secret_keys')).status).toBe(401);
    deployKey = String(body.secret_key);
    expect((await call(deployKey, 'GET', '/v1/secret_keys')).status).toBe(200);
    expect((await call(d.secretKey, 'POST', '/v1/secret_keys/sk_none/rotate')).status).toBe(404);
  });

  it('revokes a key after asking, and the revoked key is refused', async () => {
    await d.page.goto(`${d.base}/dashboard/secret-keys`);
    await d.page.getByRole('link', { name: /^Revoke Deploy/ }).click();
    await d.page.waitForURL((u) => u.pathname.endsWith('/revoke'));
    await d.page.getByRole('button', { name: 'Revoke the key' }).click();
    await d.page.waitForURL((u) => u.searchParams.has('revoked'));
    expect(await d.page.textContent('#secret-key-message')).toContain('Key revoked');
    expect((await call(deployKey, 'GET', '/v1/secret_keys')).status).toBe(401);
    const left = (await call(d.secretKey, 'GET', '/v1/secret_keys')).body.data as { secret_key_id: string }[];
    expect(left.map((k) => k.secret_key_id)).not.toContain(deployId);
    expect((await d.page.request.get(`${d.base}/dashboard/secret-keys/${deployId}/rotate`)).status()).toBe(404);
  });

  it('keeps the last key, saying why, and refuses a form without its token', async () => {
    const [only] = (await call(d.secretKey, 'GET', '/v1/secret_keys')).body.data as { secret_key_id: string }[];
    await d.page.goto(`${d.base}/dashboard/secret-keys/${only!.secret_key_id}/revoke`);
    expect(await submit('Revoke the key')).toBe(409);
    expect(await d.page.textContent('#secret-key-message')).toContain('last secret key');
    expect((await call(d.secretKey, 'GET', '/v1/secret_keys')).status).toBe(200);
    const noToken = await d.page.request.post(`${d.base}/dashboard/secret-keys/${only!.secret_key_id}/rotate`, { form: {}, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);
    expect((await call(d.secretKey, 'GET', '/v1/secret_keys')).status).toBe(200);
  });
});
