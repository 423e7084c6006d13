import { describe, expect, it } from 'vitest';
import { findMerchantByEmail } from '../../src/storage/merchants.ts';
import { useTestApp } from '../helpers/app.ts';

const cookiesOf = (res: Response) => res.headers.getSetCookie().map((c) => c.split(';')[0]!).join('; ');

/** Dashboard sign-up checks the email with the rule every entry point shares (the HTML standard's). */
describe('dashboard sign-up email', () => {
  const t = useTestApp('sqlite', { env: { DASHBOARD_SIGNUP: 'true' } });

  async function signUp(base: string, email: string): Promise<Response> {
    const page = await fetch(`${base}/dashboard/sign-up`);
    const csrf = /name="_csrf" value="([^"]+)"/.exec(await page.text())![1]!;
    return fetch(`${base}/dashboard/sign-up`, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded', cookie: cookiesOf(page) },
      body: new URLSearchParams({ _csrf: csrf, name: 'Shop', email, password: 'a long enough password' }).toString(),
    });
  }

  it('accepts a@b.c and an IDN domain, and refuses what a browser email field refuses', async () => {
    const base = await t.listen();
    for (const email of ['a@b.c', 'ops@bücher.example']) {
      const res = await signUp(base, email);
      expect(res.status, email).toBe(303);
      expect(await findMerchantByEmail(t.storage, email)).toBeDefined();
    }
    for (const email of ['a@b..c', '"quoted"@example.com']) {
      const res = await signUp(base, email);
      expect(res.status, email).toBe(400);
      expect(await res.text()).toContain('Enter a valid email address.');
    }
  });
});
