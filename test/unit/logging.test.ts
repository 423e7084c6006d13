import { Writable } from 'node:stream';
import pino, { type LoggerOptions } from 'pino';
import { describe, expect, it } from 'vitest';
import { lazyRequestLogger, loggerOptions, REDACTED_PATHS, redactSecretsInLine, redactUrl } from '../../src/http/logging.ts';

/** A pino logger with Tollgate's options, writing into a string. */
function capture(options: LoggerOptions): { log: pino.Logger; text: () => string } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk, _enc, done) {
      chunks.push(chunk.toString());
      done();
    },
  });
  return { log: pino(options, stream), text: () => chunks.join('') };
}

function tollgateOptions(level: string): LoggerOptions {
  const opts = loggerOptions(level);
  if (typeof opts !== 'object' || opts === null) throw new Error(`loggerOptions(${level}) is not an options object`);
  return opts as LoggerOptions;
}

const SECRET = 'sk_live_SuperSecretValue123';
const PROVIDER_KEY = 'sk-proj-ProviderKey456';
const EMAIL = 'ada.lovelace@example.com';

describe('redactUrl', () => {
  it('masks the values of the key and metadata query parameters', () => {
    const out = redactUrl(`/v1/forward?key=${SECRET}&model=gpt&metadata=%7B%22email%22%3A%22a%40b.c%22%7D`);
    expect(out).not.toContain(SECRET);
    expect(out).not.toContain('email');
    expect(out).not.toContain('%40');
    const params = new URLSearchParams(out.slice(out.indexOf('?') + 1));
    expect(params.get('key')).toBe('[Redacted]');
    expect(params.get('metadata')).toBe('[Redacted]');
    expect(params.get('model')).toBe('gpt');
    expect(out.startsWith('/v1/forward?')).toBe(true);
  });

  it('masks every repetition of a sensitive parameter', () => {
    const out = redactUrl(`/x?key=${SECRET}&key=${PROVIDER_KEY}`);
    expect(out).not.toContain(SECRET);
    expect(out).not.toContain(PROVIDER_KEY);
  });

  it('masks a provider key inside a percent-encoded forward target', () => {
    const target = encodeURIComponent(`https://generativelanguage.googleapis.com/v1beta/models/g:generateContent?key=${PROVIDER_KEY}&alt=sse`);
    const out = redactUrl(`/v1/forward?u=${target}`);
    expect(out).not.toContain(PROVIDER_KEY);
    const u = new URLSearchParams(out.slice(out.indexOf('?') + 1)).get('u')!;
    expect(u.startsWith('https://generativelanguage.googleapis.com/v1beta/models/g:generateContent?')).toBe(true);
    expect(new URLSearchParams(u.slice(u.indexOf('?') + 1)).get('alt')).toBe('sse');
  });

  it('leaves URLs without sensitive parameters as they are', () => {
    expect(redactUrl('/v1/meters')).toBe('/v1/meters');
    expect(redactUrl('/v1/meters?limit=2&cursor=met_1')).toBe('/v1/meters?limit=2&cursor=met_1');
  });
});

describe('redaction by parameter name and value shape', () => {
  it.each(['api_key', 'apiKey', 'access_token', 'client_secret', 'password', 'auth', 'x-auth-token', 'refresh_token'])(
    'masks the query parameter %s, also inside a raw forward target',
    (name) => {
      for (const url of [`/v1/meters?${name}=${SECRET}&model=gpt`, `/v1/forward?u=https://api.openai.com/v1/x?${name}=${SECRET}`]) {
        const out = redactUrl(url);
        expect(out).not.toContain(SECRET);
        expect(out).not.toContain('SuperSecretValue');
      }
      expect(redactUrl(`/v1/meters?${name}=${SECRET}&model=gpt`)).toContain('model=gpt');
    },
  );

  it.each([
    ['a secret key', SECRET],
    ['a spend key', 'spk_live_abcdefghijklmnop_QR'],
    ['a wallet key', 'wk_live_abcdefghijklmnop-QR'],
    ['a webhook secret', 'whsec_abcdefghijklmnop'],
    ['a connection secret', 'cons_abcdefghijklmnop'],
    ['an OpenAI key', PROVIDER_KEY],
    ['an Anthropic key', 'sk-ant-api03-abcdefghijkl'],
    ['a Google key', 'AIzaSyAbcdefghijklmnop123'],
    ['an xAI key', 'xai-abcdefghijklmnop'],
    ['an ElevenLabs key', 'sk_0123456789abcdef0123456789abcdef'],
  ])('masks %s by its shape wherever it appears in a line', (_what, secret) => {
    const line = JSON.stringify({ msg: `upstream said: invalid key ${secret}.`, err: { message: `bad ${secret}` }, note: secret });
    const out = redactSecretsInLine(line);
    expect(out).not.toContain(secret);
    expect(out).toContain('[Redacted]');
    expect(() => JSON.parse(out)).not.toThrow();
  });

  it('masks members named like credentials, keeps ids and ordinary fields', () => {
    const line = JSON.stringify({ api_key: 'plain-value-1', accessToken: 'plain-value-2', Password: 'p', spend_key_id: 'spk_01ABC', keyId: 'sk_01', model: 'gpt' });
    const out = JSON.parse(redactSecretsInLine(line));
    expect(out).toEqual({ api_key: '[Redacted]', accessToken: '[Redacted]', Password: '[Redacted]', spend_key_id: 'spk_01ABC', keyId: 'sk_01', model: 'gpt' });
  });

  it('is applied to every line a Tollgate logger writes, messages included', () => {
    const { log, text } = capture(tollgateOptions('info'));
    log.info({ upstream: { api_key: 'plain-value-3' } }, `provider refused ${PROVIDER_KEY} and Bearer ${SECRET}`);
    expect(text()).not.toContain(PROVIDER_KEY);
    expect(text()).not.toContain('SuperSecretValue');
    expect(text()).not.toContain('plain-value-3');
  });
});

describe('loggerOptions', () => {
  it('turns logging off for level silent', () => {
    expect(loggerOptions('silent')).toBe(false);
  });

  it('never writes an Authorization, x-api-key or other credential header value', () => {
    const { log, text } = capture(tollgateOptions('info'));
    const headers = {
      authorization: `Bearer ${SECRET}`,
      'x-api-key': PROVIDER_KEY,
      'x-goog-api-key': 'AIzaGoogleKey789',
      'xi-api-key': 'ElevenKey000',
      cookie: 'session=CookieValue111',
      'user-agent': 'vitest',
    };
    // Shaped like Fastify's request and a hand-written log line alike.
    log.info({ req: { id: 'r1', method: 'GET', url: `/v1/forward?key=${SECRET}`, headers } }, 'incoming request');
    log.info({ req: { id: 'r2', method: 'POST', url: '/v1/meters', headers } }, 'second request');
    const out = text();
    expect(out).toContain('incoming request');
    for (const value of [SECRET, PROVIDER_KEY, 'AIzaGoogleKey789', 'ElevenKey000', 'CookieValue111']) {
      expect(out).not.toContain(value);
    }
  });

  it('redacts header values by path even without the request serializer', () => {
    const opts = tollgateOptions('info');
    const { log, text } = capture({ level: opts.level, redact: opts.redact });
    log.info({ req: { headers: { authorization: `Bearer ${SECRET}`, 'x-api-key': PROVIDER_KEY, accept: 'json' } } });
    log.info({ res: { headers: { 'set-cookie': 'session=CookieValue111' } } });
    const out = text();
    expect(out).not.toContain(SECRET);
    expect(out).not.toContain(PROVIDER_KEY);
    expect(out).not.toContain('CookieValue111');
    expect(out).toContain('[Redacted]');
    expect(out).toContain('"accept":"json"');
  });

  it('redacts personal data and secrets in logged objects', () => {
    const { log, text } = capture(tollgateOptions('info'));
    log.info({ customer: { email: EMAIL, phone: '+15551234567', first_name: 'Ada', id: 'con_1' } }, 'customer');
    log.info({ body: { wallet: { email: EMAIL } } }, 'nested');
    log.info({ secret_key: SECRET, meter: { product_secret: 'mets_ProductSecret' } }, 'secrets');
    const out = text();
    for (const value of [EMAIL, '+15551234567', '"Ada"', SECRET, 'mets_ProductSecret']) {
      expect(out).not.toContain(value);
    }
    expect(out).toContain('"id":"con_1"');
  });

  it('logs the request URL with sensitive query values masked', () => {
    const { log, text } = capture(tollgateOptions('info'));
    log.info({ req: { id: 'r1', method: 'POST', url: `/v1/forward?key=${SECRET}&metadata=%7B%7D` } }, 'incoming request');
    const line = JSON.parse(text().trim()) as { req: { url: string; method: string } };
    expect(line.req.method).toBe('POST');
    expect(line.req.url).not.toContain(SECRET);
    expect(new URLSearchParams(line.req.url.split('?')[1]).get('key')).toBe('[Redacted]');
  });

  it('lists the credential headers among the redacted paths', () => {
    expect(REDACTED_PATHS).toEqual(
      expect.arrayContaining(['req.headers.authorization', 'req.headers["x-api-key"]', '*.email']),
    );
  });
});

describe('lazyRequestLogger', () => {
  const lines = (text: string) =>
    text
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Record<string, unknown>);

  it('writes enabled lines with the request bindings and redaction, and nothing below the level', () => {
    const { log, text } = capture(tollgateOptions('warn'));
    const child = lazyRequestLogger(log, { reqId: 'req-1' }, {});
    child.info('not written');
    child.debug({ secret_key: SECRET }, 'not written either');
    child.error({ secret_key: SECRET }, 'written');
    const written = lines(text());
    expect(written).toHaveLength(1);
    expect(written[0]).toMatchObject({ reqId: 'req-1', msg: 'written', secret_key: '[Redacted]' });
  });

  it('reports the parent level until its own is set, which changes only the child', () => {
    const { log, text } = capture(tollgateOptions('warn'));
    const child = lazyRequestLogger(log, { reqId: 'req-2' }, {});
    expect(child.level).toBe('warn');
    child.level = 'info';
    child.info('now enabled');
    log.info('parent still at warn');
    expect(child.level).toBe('info');
    expect(log.level).toBe('warn');
    expect(lines(text()).map((l) => l.msg)).toEqual(['now enabled']);
  });

  it('gives its own children the request bindings too', () => {
    const { log, text } = capture(tollgateOptions('info'));
    lazyRequestLogger(log, { reqId: 'req-3' }, {}).child({ part: 'relay' }).info('nested');
    expect(lines(text())[0]).toMatchObject({ reqId: 'req-3', part: 'relay', msg: 'nested' });
  });

  it('makes a child at once when the route sets its own level', () => {
    const { log, text } = capture(tollgateOptions('warn'));
    const child = lazyRequestLogger(log, { reqId: 'req-4' }, { level: 'debug' });
    child.debug('route level');
    expect(lines(text())[0]).toMatchObject({ reqId: 'req-4', msg: 'route level' });
  });
});
