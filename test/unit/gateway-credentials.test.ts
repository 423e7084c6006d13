import { Lava } from '@lavapayments/nodejs';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { decodeForwardToken, extractCredential, type ForwardToken } from '../../src/gateway/credentials.ts';
import { ApiError } from '../../src/http/errors.ts';

const SECRET = 'sk_live_abcdEFGH1234_-xyz';
const b64 = (value: unknown) => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64');
const lava = () => new Lava(SECRET, { baseUrl: 'http://tollgate.test/v1/' });

/** Runs fn and returns the ApiError it throws (fails the test when it does not throw one). */
function apiErrorOf(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (e) {
    if (e instanceof ApiError) return e;
    throw e;
  }
  throw new Error('expected an ApiError');
}

const token = (t: Partial<ForwardToken>): ForwardToken => ({
  generation: 'newer',
  secret_key: SECRET,
  connection_secret: null,
  product_secret: null,
  customer_id: null,
  meter_slug: null,
  provider_key: null,
  disable_billing: false,
  ...t,
});

describe('extractCredential', () => {
  it('reads each placement on its own', () => {
    expect(extractCredential({ authorization: 'Bearer tok1' }, null)).toEqual({ token: 'tok1', placement: 'authorization' });
    expect(extractCredential({ 'x-api-key': 'tok2' }, null)).toEqual({ token: 'tok2', placement: 'x-api-key' });
    expect(extractCredential({ 'x-goog-api-key': 'tok3' }, null)).toEqual({ token: 'tok3', placement: 'x-goog-api-key' });
    expect(extractCredential({ 'xi-api-key': 'tok4' }, null)).toEqual({ token: 'tok4', placement: 'xi-api-key' });
    expect(extractCredential({}, 'tok5')).toEqual({ token: 'tok5', placement: 'query-key' });
  });

  it('follows the documented precedence: bearer, x-api-key, x-goog-api-key, xi-api-key, key', () => {
    const all = {
      authorization: 'Bearer a',
      'x-api-key': 'b',
      'x-goog-api-key': 'c',
      'xi-api-key': 'd',
    };
    expect(extractCredential(all, 'e')?.placement).toBe('authorization');
    const { authorization: _a, ...noAuth } = all;
    expect(extractCredential(noAuth, 'e')).toEqual({ token: 'b', placement: 'x-api-key' });
    const { 'x-api-key': _b, ...noX } = noAuth;
    expect(extractCredential(noX, 'e')).toEqual({ token: 'c', placement: 'x-goog-api-key' });
    const { 'x-goog-api-key': _c, ...noGoog } = noX;
    expect(extractCredential(noGoog, 'e')).toEqual({ token: 'd', placement: 'xi-api-key' });
    expect(extractCredential({}, 'e')).toEqual({ token: 'e', placement: 'query-key' });
  });

  it('accepts any case of the Bearer scheme and trims whitespace', () => {
    expect(extractCredential({ authorization: 'bearer   tok ' }, null)).toEqual({ token: 'tok', placement: 'authorization' });
    expect(extractCredential({ authorization: 'BEARER tok' }, null)?.token).toBe('tok');
    expect(extractCredential({ 'x-api-key': '  tok  ' }, null)?.token).toBe('tok');
    expect(extractCredential({}, ' tok ')?.token).toBe('tok');
  });

  it('skips empty values and a non-Bearer Authorization, falling through to the next placement', () => {
    expect(extractCredential({ authorization: 'Basic dXNlcjpwYXNz', 'x-api-key': 'tok' }, null)).toEqual({
      token: 'tok',
      placement: 'x-api-key',
    });
    expect(extractCredential({ authorization: 'Bearer ', 'xi-api-key': 'tok' }, null)?.placement).toBe('xi-api-key');
    expect(extractCredential({ authorization: 'Bearer a b' }, 'k')?.placement).toBe('query-key');
    expect(extractCredential({ 'x-api-key': '', 'x-goog-api-key': '   ' }, 'k')?.placement).toBe('query-key');
    expect(extractCredential({ 'x-api-key': ['tok', 'other'] }, null)?.token).toBe('tok');
  });

  it('returns null when there is no credential at all', () => {
    expect(extractCredential({}, null)).toBeNull();
    expect(extractCredential({ 'content-type': 'application/json' }, '')).toBeNull();
    expect(extractCredential({ authorization: 'Basic abc' }, '  ')).toBeNull();
  });
});

describe('decodeForwardToken: encodings', () => {
  const json = { secret_key: SECRET, customer_id: 'con_1', meter_slug: 'chat' };
  const expected = token({ customer_id: 'con_1', meter_slug: 'chat' });

  it('treats a credential with a secret-key prefix as a raw secret key', () => {
    expect(decodeForwardToken(SECRET)).toBe('not_a_token');
    expect(decodeForwardToken('sk_live_')).toBe('not_a_token');
  });

  it('decodes standard base64, base64url and unpadded base64', () => {
    // Characters that land on + and / in the standard alphabet and on - and _ in the URL one.
    const value = { ...json, provider_key: 'k>>>???~~~' };
    const standard = Buffer.from(JSON.stringify(value)).toString('base64');
    const url = Buffer.from(JSON.stringify(value)).toString('base64url');
    expect(standard).toMatch(/[+/]/);
    expect(url).toMatch(/[-_]/);
    const want = { ...expected, provider_key: 'k>>>???~~~' };
    expect(decodeForwardToken(standard)).toEqual(want);
    expect(decodeForwardToken(url)).toEqual(want);
    expect(decodeForwardToken(standard.replace(/=+$/, ''))).toEqual(want);
    // Padded base64url is tolerated too.
    const padded = url + '='.repeat((4 - (url.length % 4)) % 4);
    expect(decodeForwardToken(padded)).toEqual(want);
  });

  it('needs every padding length to work, unpadded', () => {
    for (const extra of ['', 'a', 'ab', 'abc']) {
      const encoded = b64({ ...json, provider_key: `pk${extra}` });
      expect(decodeForwardToken(encoded.replace(/=+$/, ''))).toEqual({ ...expected, provider_key: `pk${extra}` });
    }
  });

  it.each([
    ['an empty string', ''],
    ['characters outside base64', 'not base64!'],
    ['spaces', 'eyJh IjoxfQ=='],
    ['an impossible length', 'eyJhI'],
    ['wrong padding', 'eyJ9='],
    ['padding in the middle', 'ey==Jh'],
    ['mixed alphabets', 'ab+_cd/-'],
    ['a non-secret-key provider key', 'sk-proj-abc_def'],
  ])('refuses %s with forward_token_json_invalid', (_label, value) => {
    const err = apiErrorOf(() => decodeForwardToken(value));
    expect(err.code).toBe('forward_token_json_invalid');
    expect(err.status).toBe(400);
  });

  it.each([
    ['not JSON', b64('hello world')],
    ['truncated JSON', b64('{"secret_key":')],
    ['invalid UTF-8', Buffer.from([0x7b, 0xff, 0xfe, 0x7d]).toString('base64')],
    ['a JSON array', b64([SECRET])],
    ['a JSON string', b64(JSON.stringify(SECRET))],
    ['JSON null', b64('null')],
    ['a JSON number', b64('42')],
  ])('refuses a token that decodes to %s', (_label, value) => {
    const err = apiErrorOf(() => decodeForwardToken(value));
    expect(err.code).toBe('forward_token_json_invalid');
    expect(err.status).toBe(400);
    expect(err.message).not.toContain(SECRET);
  });
});

describe('decodeForwardToken: member types', () => {
  it.each([
    [{ customer_id: 'con_1', meter_slug: 'chat' }, ['secret_key'], 'is required'],
    [{ secret_key: null }, ['secret_key'], 'must be a string'],
    [{ secret_key: 42 }, ['secret_key'], 'must be a string'],
    [{ secret_key: '' }, ['secret_key'], 'must not be empty'],
    [{ secret_key: SECRET, customer_id: 7, meter_slug: 'chat' }, ['customer_id'], 'must be a string or null'],
    [{ secret_key: SECRET, meter_slug: ['chat'] }, ['meter_slug'], 'must be a string or null'],
    [{ secret_key: SECRET, provider_key: {} }, ['provider_key'], 'must be a string or null'],
    [{ secret_key: SECRET, connection_secret: true, product_secret: 'p' }, ['connection_secret'], 'must be a string or null'],
    [{ secret_key: SECRET, customer_id: 'c', meter_slug: 'm', disable_billing: 'true' }, ['disable_billing'], 'must be a boolean or null'],
    [{ secret_key: SECRET, customer_id: 'c', meter_slug: '' }, ['meter_slug'], 'must not be empty'],
  ])('refuses %j with an issue at %j', (value, path, message) => {
    const err = apiErrorOf(() => decodeForwardToken(b64(value)));
    expect(err.code).toBe('forward_token_json_invalid');
    expect(err.issues).toContainEqual({ path, message });
  });

  it('lists every wrong member', () => {
    const err = apiErrorOf(() => decodeForwardToken(b64({ secret_key: 1, customer_id: 2, meter_slug: 3 })));
    expect(err.issues?.map((i) => i.path[0])).toEqual(['secret_key', 'customer_id', 'meter_slug']);
  });

  it('ignores members it does not know', () => {
    expect(decodeForwardToken(b64({ secret_key: SECRET, future_member: { a: 1 } }))).toEqual(token({}));
  });

  it('reads absent, null and false the same way', () => {
    const all = decodeForwardToken(
      b64({ secret_key: SECRET, connection_secret: null, product_secret: null, customer_id: null, meter_slug: null, provider_key: null, disable_billing: null }),
    );
    expect(all).toEqual(token({}));
    expect(decodeForwardToken(b64({ secret_key: SECRET, disable_billing: false }))).toEqual(token({}));
  });
});

describe('decodeForwardToken: combinations', () => {
  it.each([
    ['customer_id without meter_slug', { customer_id: 'con_1' }, ['meter_slug']],
    ['connection_id without meter_slug', { connection_id: 'con_1', meter_slug: null }, ['meter_slug']],
    ['connection_secret without product_secret', { connection_secret: 'cons_x' }, ['product_secret']],
    ['older and newer members mixed', { connection_secret: 'cons_x', product_secret: 'mets_y', meter_slug: 'chat' }, []],
    ['older members with disable_billing', { connection_secret: 'cons_x', product_secret: 'mets_y', disable_billing: true }, []],
    ['product_secret with customer_id', { product_secret: 'mets_y', customer_id: 'con_1', meter_slug: 'chat' }, []],
    ['connection_id and customer_id that differ', { connection_id: 'con_1', customer_id: 'con_2', meter_slug: 'm' }, ['customer_id']],
    ['disable_billing without a customer', { meter_slug: 'chat', disable_billing: true }, ['disable_billing']],
    ['disable_billing alone', { disable_billing: true }, ['disable_billing']],
  ])('refuses %s with forward_token_invalid', (_label, members, path) => {
    const err = apiErrorOf(() => decodeForwardToken(b64({ secret_key: SECRET, ...members })));
    expect(err.code).toBe('forward_token_invalid');
    expect(err.status).toBe(400);
    expect(err.issues?.[0]?.path).toEqual(path);
  });

  it('accepts connection_id and customer_id naming the same customer', () => {
    expect(decodeForwardToken(b64({ secret_key: SECRET, connection_id: 'con_1', customer_id: 'con_1', meter_slug: 'm' }))).toEqual(
      token({ customer_id: 'con_1', meter_slug: 'm' }),
    );
  });
});

describe('decodeForwardToken: tokens as the published clients build them', () => {
  it('11.x customer billing, with provider_key and disable_billing', () => {
    const t = lava().generateForwardToken({ customer_id: 'con_1', meter_slug: 'chat', provider_key: 'sk-own', disable_billing: true });
    expect(t).toBe(Buffer.from(Buffer.from(t, 'base64').toString()).toString('base64')); // standard base64
    expect(decodeForwardToken(t)).toEqual(
      token({ customer_id: 'con_1', meter_slug: 'chat', provider_key: 'sk-own', disable_billing: true }),
    );
    expect(decodeForwardToken(lava().generateForwardToken({ customer_id: 'con_1', meter_slug: 'chat' }))).toEqual(
      token({ customer_id: 'con_1', meter_slug: 'chat' }),
    );
  });

  it('11.x unmanaged (BYOK): customer_id and meter_slug null, provider_key set', () => {
    const t = lava().generateForwardToken({ customer_id: null, meter_slug: null, provider_key: 'sk-own' });
    expect(JSON.parse(Buffer.from(t, 'base64').toString())).toMatchObject({ customer_id: null, meter_slug: null });
    expect(decodeForwardToken(t)).toEqual(token({ provider_key: 'sk-own' }));
  });

  it('11.x meter only, with customer_id null or absent', () => {
    expect(decodeForwardToken(lava().generateForwardToken({ customer_id: null, meter_slug: 'chat' }))).toEqual(
      token({ meter_slug: 'chat' }),
    );
    expect(decodeForwardToken(lava().generateForwardToken({ meter_slug: 'chat', provider_key: 'pk' }))).toEqual(
      token({ meter_slug: 'chat', provider_key: 'pk' }),
    );
  });

  it('11.x merchant billing: secret_key only, optionally provider_key', () => {
    const t = lava().generateForwardToken({});
    expect(JSON.parse(Buffer.from(t, 'base64').toString())).toEqual({ secret_key: SECRET });
    expect(decodeForwardToken(t)).toEqual(token({}));
    expect(decodeForwardToken(lava().generateForwardToken({ provider_key: 'pk' }))).toEqual(token({ provider_key: 'pk' }));
  });

  it('8.x: secret_key, connection_id, meter_slug, provider_key (built by hand)', () => {
    expect(decodeForwardToken(b64({ secret_key: SECRET, connection_id: 'con_1', meter_slug: 'chat', provider_key: null }))).toEqual(
      token({ customer_id: 'con_1', meter_slug: 'chat' }),
    );
  });

  it('2.5.0: secret_key, connection_secret, product_secret, provider_key (built by hand)', () => {
    const older = (members: object) => b64({ secret_key: SECRET, ...members });
    expect(decodeForwardToken(older({ connection_secret: 'cons_a', product_secret: 'mets_b' }))).toEqual(
      token({ generation: 'older', connection_secret: 'cons_a', product_secret: 'mets_b' }),
    );
    expect(decodeForwardToken(older({ connection_secret: 'cons_a', product_secret: 'mets_b', provider_key: 'pk' }))).toEqual(
      token({ generation: 'older', connection_secret: 'cons_a', product_secret: 'mets_b', provider_key: 'pk' }),
    );
    // Metering only with the caller's own key.
    expect(decodeForwardToken(older({ connection_secret: null, product_secret: null, provider_key: 'pk' }))).toEqual(
      token({ provider_key: 'pk' }),
    );
  });

  describe('gateway() (11.2), with fetch captured', () => {
    afterEach(() => vi.unstubAllGlobals());

    async function tokenSentBy(opts: Parameters<Lava['gateway']>[1]): Promise<string> {
      let authorization: string | null = null;
      vi.stubGlobal('fetch', async (_url: string, init: RequestInit) => {
        authorization = new Headers(init.headers).get('authorization');
        return new Response('{}', { status: 200, headers: { 'content-type': 'application/json' } });
      });
      await lava().gateway('https://api.openai.com/v1/chat/completions', { body: { model: 'gpt-4o-mini' }, ...opts });
      const found = extractCredential({ authorization: authorization ?? undefined }, null);
      expect(found?.placement).toBe('authorization');
      return found!.token;
    }

    it('builds each shape the server decodes', async () => {
      expect(decodeForwardToken(await tokenSentBy({ customer_id: 'con_1', meter_slug: 'chat' }))).toEqual(
        token({ customer_id: 'con_1', meter_slug: 'chat' }),
      );
      expect(decodeForwardToken(await tokenSentBy({ customer_id: 'con_1', meter_slug: 'chat', disable_billing: true }))).toEqual(
        token({ customer_id: 'con_1', meter_slug: 'chat', disable_billing: true }),
      );
      expect(decodeForwardToken(await tokenSentBy({ meter_slug: 'chat' }))).toEqual(token({ meter_slug: 'chat' }));
      expect(decodeForwardToken(await tokenSentBy({ provider_key: 'pk' }))).toEqual(token({ provider_key: 'pk' }));
      expect(decodeForwardToken(await tokenSentBy({}))).toEqual(token({}));
    });

    it('refuses customer_id without meter_slug locally, as the server does', async () => {
      await expect(tokenSentBy({ customer_id: 'con_1' })).rejects.toThrow(/requires meter_slug/);
      const err = apiErrorOf(() => decodeForwardToken(b64({ secret_key: SECRET, customer_id: 'con_1' })));
      expect(err.code).toBe('forward_token_invalid');
    });
  });
});
