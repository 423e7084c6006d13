import { describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import { useTestApp } from '../helpers/app.ts';
import { refusedBeforeUpload } from '../helpers/uploads.ts';
import { printFigures } from './harness.ts';

/**
 * The routes anyone may call without an API key read only what their forms need, and refuse a
 * large upload before taking it: each declared 10 MiB body below is answered after its first KiB
 * (refusedBeforeUpload fails on a server that waits for the rest), whatever its content type.
 * Small bodies still reach the routes.
 */

const PUBLIC_POSTS = ['/checkout/pay', '/checkout/confirm', '/dashboard/sign-in', '/dashboard/sign-up', '/dashboard/sign-out', '/auth/connect', '/v1/auth/callback'];
const CONTENT_TYPES = ['application/json', 'application/x-www-form-urlencoded', 'application/octet-stream', 'text/plain'];

describe.each(databasesUnderTest())('public routes and large bodies (%s)', (dialect) => {
  const t = useTestApp(dialect, { env: { RATE_LIMIT_PER_MINUTE: '100000000', DASHBOARD_SIGNUP: 'true' } });

  it('answers every declared 10 MiB upload to a public route with 413 or 415 without reading it, 32 at once', async () => {
    const base = await t.listen();
    const attempts = PUBLIC_POSTS.flatMap((path) => CONTENT_TYPES.map((contentType) => ({ path, contentType })));
    const refusals = await Promise.all(
      [...attempts, ...attempts].slice(0, Math.max(32, attempts.length)).map(async ({ path, contentType }) => ({
        path,
        contentType,
        ...(await refusedBeforeUpload(`${base}${path}`, {}, { contentType })),
      })),
    );
    for (const r of refusals) expect([413, 415], `${r.path} ${r.contentType}: ${r.status}`).toContain(r.status);
    // JSON bodies get the API's envelope; pages answer with a page.
    const callback = refusals.find((r) => r.path === '/v1/auth/callback' && r.contentType === 'application/json')!;
    expect(callback.status).toBe(413);
    expect(JSON.parse(callback.body).error.code).toBe('payload_too_large');
    printFigures(`public bodies (${dialect})`, { uploads: refusals.length, refused_413: refusals.filter((r) => r.status === 413).length, refused_415: refusals.filter((r) => r.status === 415).length });
  });

  it('refuses bodies just over each route\'s limit and still takes small ones', async () => {
    const post = (url: string, contentType: string, payload: string) => t.app.inject({ method: 'POST', url, headers: { 'content-type': contentType }, payload });
    const form = (bytes: number) => new URLSearchParams({ email: 'a@example.com', password: 'x'.repeat(bytes) }).toString();
    expect((await post('/dashboard/sign-in', 'application/x-www-form-urlencoded', form(5 * 1024))).statusCode).toBe(413);
    expect((await post('/checkout/pay', 'application/x-www-form-urlencoded', form(9 * 1024))).statusCode).toBe(413);
    expect((await post('/v1/auth/callback', 'application/json', JSON.stringify({ code: 'x'.repeat(5 * 1024) }))).statusCode).toBe(413);
    // Small ones reach the route: a sign-in without its CSRF token, an unknown checkout token, an unknown code.
    expect((await post('/dashboard/sign-in', 'application/x-www-form-urlencoded', form(8))).statusCode).toBe(403);
    expect((await post('/checkout/pay', 'application/x-www-form-urlencoded', 'token=nope')).statusCode).toBe(404);
    const callback = await post('/v1/auth/callback', 'application/json', JSON.stringify({ code: 'unknown' }));
    expect(callback.statusCode).toBe(400);
    expect(callback.json().error.code).toBe('auth_code_invalid');
  });
});
