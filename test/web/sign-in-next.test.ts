import { describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { safeNextPath } from '../../src/web/session.ts';
import { useTestApp } from '../helpers/app.ts';

const EMAIL = 'next@example.com';
const PASSWORD = 'a long enough password';

/** The cookies a response sets, as one Cookie header. */
const cookiesOf = (res: Response, previous = '') =>
  [previous, ...res.headers.getSetCookie().map((c) => c.split(';')[0]!)].filter(Boolean).join('; ');

/**
 * `next` after sign-in becomes a Location header. Whatever a link puts there — non-ASCII, CR, LF,
 * NUL, a lone surrogate — the answer is a redirect to a path on this site, never a 500.
 */
describe('the sign-in destination (next)', () => {
  const t = useTestApp('sqlite');

  async function signIn(base: string, next: string): Promise<{ res: Response; cookie: string }> {
    const page = await fetch(`${base}/dashboard/sign-in`);
    const csrf = /name="_csrf" value="([^"]+)"/.exec(await page.text())![1]!;
    const cookie = cookiesOf(page);
    const res = await fetch(`${base}/dashboard/sign-in`, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded', cookie },
      body: new URLSearchParams({ _csrf: csrf, email: EMAIL, password: PASSWORD, next }).toString(),
    });
    return { res, cookie: cookiesOf(res, cookie) };
  }

  const NEXTS: [string, string][] = [
    ['/dashboard/😀', '/dashboard/%F0%9F%98%80'],
    ['/dashboard/a\r\nSet-Cookie: x=1', '/dashboard/a%0D%0ASet-Cookie:%20x=1'],
    ['/dashboard/\u0000', '/dashboard/%00'],
    // A form cannot carry a lone surrogate: the browser sends U+FFFD, which is encoded like any other.
    ['/dashboard/\ud800', '/dashboard/%EF%BF%BD'],
    ['//evil.example/', '/dashboard'],
    ['/dashboard/customers?x=%41', '/dashboard/customers?x=%41'],
  ];

  it('redirects to the path, percent-encoded, after signing in and when already signed in', async () => {
    await createMerchant(t.storage, { name: 'Next', email: EMAIL, password: PASSWORD }, new Date().toISOString());
    const base = await t.listen();
    // Signing in is limited to a few attempts per account: three of them, then the signed-in session.
    let cookie = '';
    for (const [next, location] of NEXTS.slice(0, 3)) {
      const signedIn = await signIn(base, next);
      expect(signedIn.res.status, JSON.stringify(next)).toBe(303);
      expect(signedIn.res.headers.get('location'), JSON.stringify(next)).toBe(location);
      cookie = signedIn.cookie;
    }
    for (const [next, location] of NEXTS) {
      const url = new URL('/dashboard/sign-in', base);
      url.searchParams.set('next', next);
      const again = await fetch(url, { redirect: 'manual', headers: { cookie } });
      expect(again.status, JSON.stringify(next)).toBe(302);
      expect(again.headers.get('location'), JSON.stringify(next)).toBe(location);
    }
    const raw = await fetch(`${base}/dashboard/sign-in?next=/dashboard/%ED%A0%80%00`, { redirect: 'manual', headers: { cookie } });
    expect(raw.status).toBe(302);
    expect(raw.headers.get('location')).toMatch(/^\/dashboard(\/[\x21-\x7e]*)?$/);
  });

  it('keeps a path that cannot be encoded (a lone surrogate) out of the header', () => {
    expect(safeNextPath('/dashboard/\ud800')).toBe('/dashboard');
  });
});
