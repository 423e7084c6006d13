import { describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { startTestApp, type TestApp, useTestApp } from '../helpers/app.ts';
import { tollgate } from '../helpers/cli.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const PASSWORD = 'a long enough password';
const FIFTEEN_MINUTES = 15 * 60_000;

type Answer = { status: number; location: string | undefined; body: string; setCookie: string[] };

/** A browser of its own (cookies, CSRF token) reaching the app from `address`, optionally through a proxy. */
function visitor(t: TestApp, address: string, opts: { forwardedFor?: string; forwardedProto?: string } = {}) {
  let cookie = '';
  let csrf = '';
  const headers = () => ({
    ...(cookie ? { cookie } : {}),
    ...(opts.forwardedFor ? { 'x-forwarded-for': opts.forwardedFor } : {}),
    ...(opts.forwardedProto ? { 'x-forwarded-proto': opts.forwardedProto } : {}),
  });
  const remember = (setCookie: string | string[] | undefined) => {
    const jar = new Map(cookie ? cookie.split('; ').map((c) => c.split('=') as [string, string]) : []);
    for (const c of [setCookie ?? []].flat()) {
      const [pair] = c.split(';');
      const at = pair!.indexOf('=');
      jar.set(pair!.slice(0, at), pair!.slice(at + 1));
    }
    cookie = [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
  };
  const answer = (res: Awaited<ReturnType<TestApp['app']['inject']>>): Answer => {
    remember(res.headers['set-cookie'] as string[] | undefined);
    return {
      status: res.statusCode,
      location: res.headers.location as string | undefined,
      body: res.body,
      setCookie: [res.headers['set-cookie'] ?? []].flat() as string[],
    };
  };
  return {
    async get(url: string): Promise<Answer> {
      return answer(await t.app.inject({ method: 'GET', url, remoteAddress: address, headers: headers() }));
    },
    async post(url: string, form: Record<string, string>): Promise<Answer> {
      const page = await this.get(url === '/dashboard/account/password' ? '/dashboard/account' : url.replace(/\?.*$/, '') + (form.token ? `?token=${encodeURIComponent(form.token)}` : ''));
      // A page without a form (already signed in, a spent link) leaves the last token in force.
      csrf = /name="_csrf" value="([^"]+)"/.exec(page.body)?.[1] ?? csrf;
      return answer(
        await t.app.inject({
          method: 'POST',
          url,
          remoteAddress: address,
          headers: { ...headers(), 'content-type': 'application/x-www-form-urlencoded' },
          payload: new URLSearchParams({ _csrf: csrf, ...form }).toString(),
        }),
      );
    },
    signIn(email: string, password: string): Promise<Answer> {
      return this.post('/dashboard/sign-in', { email, password });
    },
  };
}

describe('dashboard sign-in protection', () => {
  const t = useTestApp('sqlite', { env: { TRUST_PROXY: '127.0.0.1' } });

  it('counts only failures: many correct sign-ins in a row all succeed', async () => {
    await createMerchant(t.storage, { name: 'Often', email: 'often@acme.example', password: PASSWORD }, new Date().toISOString());
    for (let i = 0; i < 8; i++) {
      const answer = await visitor(t, '203.0.113.7').signIn('often@acme.example', PASSWORD);
      expect(answer.status, `sign-in ${i + 1}`).toBe(303);
    }
  });

  it('forgets the failures once the right password is given', async () => {
    await createMerchant(t.storage, { name: 'Typo', email: 'typo@acme.example', password: PASSWORD }, new Date().toISOString());
    const fromHere = () => visitor(t, '203.0.113.8');
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 4; i++) expect((await fromHere().signIn('typo@acme.example', 'wrong password!')).status).toBe(401);
      expect((await fromHere().signIn('typo@acme.example', PASSWORD)).status, `round ${round}`).toBe(303);
    }
  });

  it('after 5 wrong passwords refuses that account from that address only, until the window passes', async () => {
    await createMerchant(t.storage, { name: 'Owner', email: 'owner@acme.example', password: PASSWORD }, new Date().toISOString());
    const stranger = visitor(t, '127.0.0.1', { forwardedFor: '198.51.100.9' });
    for (let i = 0; i < 5; i++) expect((await stranger.signIn('owner@acme.example', `guess number ${i}`)).status).toBe(401);
    const refused = await stranger.signIn('owner@acme.example', PASSWORD);
    expect(refused.status).toBe(429);
    expect(refused.body).toContain('Too many wrong passwords for this account from your network');

    // The owner, elsewhere behind the same (trusted) proxy, is not locked out by the stranger.
    const owner = visitor(t, '127.0.0.1', { forwardedFor: '192.0.2.44' });
    expect((await owner.signIn('owner@acme.example', PASSWORD)).status).toBe(303);

    t.clock.advance(FIFTEEN_MINUTES);
    expect((await stranger.signIn('owner@acme.example', PASSWORD)).status).toBe(303);
  });

  it('after 20 failures from one address refuses every account from it, not from others', async () => {
    await createMerchant(t.storage, { name: 'Sprayed', email: 'sprayed@acme.example', password: PASSWORD }, new Date().toISOString());
    const sprayer = visitor(t, '127.0.0.1', { forwardedFor: '198.51.100.77' });
    for (let i = 0; i < 20; i++) expect((await sprayer.signIn(`victim${i}@acme.example`, 'password123456')).status).toBe(401);
    const refused = await sprayer.signIn('sprayed@acme.example', PASSWORD);
    expect(refused.status).toBe(429);
    expect(refused.body).toContain('Too many failed sign-ins from your network');
    expect((await visitor(t, '127.0.0.1', { forwardedFor: '192.0.2.45' }).signIn('sprayed@acme.example', PASSWORD)).status).toBe(303);
    t.clock.advance(FIFTEEN_MINUTES);
  });

  it('after 5 wrong current passwords the change-password form refuses even the right one, until the window passes', async () => {
    await createMerchant(t.storage, { name: 'Borrowed', email: 'borrowed@acme.example', password: PASSWORD }, new Date().toISOString());
    const session = visitor(t, '203.0.113.40');
    expect((await session.signIn('borrowed@acme.example', PASSWORD)).status).toBe(303);
    const change = (current: string) => session.post('/dashboard/account/password', { current_password: current, new_password: 'a newer long password', confirm_password: 'a newer long password' });
    for (let i = 0; i < 5; i++) expect((await change(`guess number ${i}`)).status, `guess ${i + 1}`).toBe(400);
    const refused = await change(PASSWORD);
    expect(refused.status).toBe(429);
    expect(refused.body).toContain('Too many wrong current passwords');

    t.clock.advance(FIFTEEN_MINUTES);
    const changed = await change(PASSWORD);
    expect(changed.status).toBe(200);
    expect(changed.body).toContain('Password changed');
  });

  it('marks the session cookie Secure when the trusted proxy says the visitor came over https', async () => {
    await createMerchant(t.storage, { name: 'Tls', email: 'tls@acme.example', password: PASSWORD }, new Date().toISOString());
    const viaHttps = await visitor(t, '127.0.0.1', { forwardedFor: '192.0.2.50', forwardedProto: 'https' }).signIn('tls@acme.example', PASSWORD);
    expect(viaHttps.setCookie.find((c) => c.startsWith('tollgate_session='))).toMatch(/; Secure/);
    const plain = await visitor(t, '127.0.0.1', { forwardedFor: '192.0.2.51' }).signIn('tls@acme.example', PASSWORD);
    expect(plain.setCookie.find((c) => c.startsWith('tollgate_session='))).not.toMatch(/; Secure/);
  });
});

describe('without TRUST_PROXY', () => {
  const t = useTestApp('sqlite');

  it('believes neither X-Forwarded-For nor X-Forwarded-Proto', async () => {
    await createMerchant(t.storage, { name: 'Direct', email: 'direct@acme.example', password: PASSWORD }, new Date().toISOString());
    // Five failures claiming five different addresses are five failures from the one real address.
    for (let i = 0; i < 5; i++) {
      const liar = visitor(t, '203.0.113.20', { forwardedFor: `198.51.100.${i}` });
      expect((await liar.signIn('direct@acme.example', 'not the password')).status).toBe(401);
    }
    expect((await visitor(t, '203.0.113.20', { forwardedFor: '198.51.100.99' }).signIn('direct@acme.example', PASSWORD)).status).toBe(429);
    const https = await visitor(t, '203.0.113.21', { forwardedProto: 'https' }).signIn('direct@acme.example', PASSWORD);
    expect(https.status).toBe(303);
    expect(https.setCookie.find((c) => c.startsWith('tollgate_session='))).not.toMatch(/; Secure/);
  });
});

describe.each(databasesUnderTest())('operator password commands on %s', (dialect) => {
  it('reset-link gives a merchant without email a sign-in: the link works once, then sign-in works', async () => {
    const t = await startTestApp(dialect);
    try {
      const { merchant } = await createMerchant(t.storage, { name: 'No login' }, new Date().toISOString());
      const env = { DATABASE_URL: t.database.url };
      const issued = await tollgate(['admin', 'reset-link', '--merchant', merchant.id, '--email', 'Late@Acme.example', '--base-url', 'https://gate.acme.example'], env);
      expect(issued.code, issued.stderr).toBe(0);
      const link = new URL(issued.stdout.trim());
      expect(link.origin + link.pathname).toBe('https://gate.acme.example/dashboard/reset-password');
      const token = link.searchParams.get('token')!;
      const stored = await t.storage.db.selectFrom('password_resets').selectAll().execute();
      expect(stored.map((r) => r.token_hash)).not.toContain(token);

      const browser = visitor(t, '203.0.113.30');
      expect((await browser.get(`/dashboard/reset-password?token=${encodeURIComponent(token)}`)).status).toBe(200);
      const mismatch = await browser.post('/dashboard/reset-password', { token, new_password: 'brand new secret', confirm_password: 'brand new secreT' });
      expect(mismatch.status).toBe(400);
      expect(mismatch.body).toContain('The two new passwords differ');
      const set = await browser.post('/dashboard/reset-password', { token, new_password: 'brand new secret', confirm_password: 'brand new secret' });
      expect(set.status).toBe(200);
      expect(set.body).toContain('Password set');
      const again = await browser.post('/dashboard/reset-password', { token, new_password: 'another new one!', confirm_password: 'another new one!' });
      expect(again.status).toBe(410);
      expect(again.body).toContain('already used');
      expect((await visitor(t, '203.0.113.31').signIn('late@acme.example', 'brand new secret')).status).toBe(303);

      const expiring = await tollgate(['admin', 'reset-link', '--merchant', merchant.id, '--base-url', 'http://localhost:1'], env);
      const expiringToken = new URL(expiring.stdout.trim()).searchParams.get('token')!;
      // The CLI stamps the link with the system clock: the app's clock is put a day past that.
      t.clock.set(Date.now() + 24 * 60 * 60_000 + 1);
      const expired = await visitor(t, '203.0.113.32').get(`/dashboard/reset-password?token=${encodeURIComponent(expiringToken)}`);
      expect(expired.status).toBe(410);
      expect(expired.body).toContain('expired');
    } finally {
      await t.close();
    }
  });

  it('set-password sets password and email, ends sessions, and refuses what it cannot do with a message', async () => {
    const t = await startTestApp(dialect);
    try {
      const { merchant } = await createMerchant(t.storage, { name: 'Set' }, new Date().toISOString());
      await createMerchant(t.storage, { name: 'Taken', email: 'taken@acme.example', password: PASSWORD }, new Date().toISOString());
      const env = { DATABASE_URL: t.database.url };
      const [noEmail, short, taken, unknown] = await Promise.all([
        tollgate(['admin', 'set-password', '--merchant', merchant.id, '--password', 'long enough!'], env),
        tollgate(['admin', 'set-password', '--merchant', merchant.id, '--password', 'short', '--email', 'set@acme.example'], env),
        tollgate(['admin', 'set-password', '--merchant', merchant.id, '--password', 'long enough!', '--email', 'taken@acme.example'], env),
        tollgate(['admin', 'set-password', '--merchant', 'mer_nope', '--password', 'long enough!', '--email', 'x@acme.example'], env),
      ]);
      expect(noEmail.stderr.trim()).toBe(`Merchant ${merchant.id} has no sign-in email; give one with --email.`);
      expect(short.stderr.trim()).toBe('The password must have at least 10 characters.');
      expect(taken.stderr.trim()).toBe('Another merchant already signs in with taken@acme.example.');
      expect(unknown.stderr.trim()).toBe('No merchant with id mer_nope.');
      expect([noEmail, short, taken, unknown].map((r) => r.code)).not.toContain(0);

      const ok = await tollgate(['admin', 'set-password', '--merchant', merchant.id, '--password', 'long enough!', '--email', 'set@acme.example'], env);
      expect(ok.code, ok.stderr).toBe(0);
      const browser = visitor(t, '203.0.113.40');
      expect((await browser.signIn('set@acme.example', 'long enough!')).status).toBe(303);
      expect((await browser.get('/dashboard/account')).status).toBe(200);
      await tollgate(['admin', 'set-password', '--merchant', merchant.id, '--password', 'changed again!'], env);
      expect((await browser.get('/dashboard/account')).status).toBe(303);
    } finally {
      await t.close();
    }
  });
});
