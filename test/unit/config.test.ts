import { describe, expect, it } from 'vitest';
import { ConfigError, DEFAULT_DATABASE_URL, loadConfig } from '../../src/config.ts';

function configError(env: Record<string, string>): ConfigError {
  try {
    loadConfig(env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error(`loadConfig(${JSON.stringify(env)}) did not throw`);
}

describe('loadConfig', () => {
  it('has documented defaults for an empty environment', () => {
    const c = loadConfig({});
    expect(c.port).toBe(8080);
    expect(c.host).toBe('127.0.0.1');
    expect(c.databaseUrl).toBe('sqlite:./data/tollgate.db');
    expect(DEFAULT_DATABASE_URL).toBe('sqlite:./data/tollgate.db');
    expect(c.redisUrl).toBeUndefined();
    expect(c.logLevel).toBe('info');
    expect(c.rateLimitPerMinute).toBe(1000);
    expect(c.upstreamOverrides).toEqual({});
    expect(c.providerKeys).toEqual({});
    expect(c.metricsToken).toBeUndefined();
    expect(c.heapGrowingPercent).toBe(30);
  });

  it('reads HEAP_GROWING_PERCENT as a percentage, or off for V8\'s own factor', () => {
    expect(loadConfig({ HEAP_GROWING_PERCENT: '50' }).heapGrowingPercent).toBe(50);
    expect(loadConfig({ HEAP_GROWING_PERCENT: 'off' }).heapGrowingPercent).toBeNull();
  });

  it('treats an exported but empty variable as unset', () => {
    const c = loadConfig({ PORT: '', DATABASE_URL: '', LOG_LEVEL: '' });
    expect(c.port).toBe(8080);
    expect(c.databaseUrl).toBe(DEFAULT_DATABASE_URL);
    expect(c.logLevel).toBe('info');
  });

  it('reads every variable it is given', () => {
    const c = loadConfig({
      PORT: '0',
      HOST: '0.0.0.0',
      DATABASE_URL: 'postgres://u:p@db:5432/tollgate',
      REDIS_URL: 'rediss://cache:6380',
      LOG_LEVEL: 'debug',
      SERVICE_CHARGE_RATE: '1.9',
      RATE_LIMIT_PER_MINUTE: '60',
      UPSTREAM_OVERRIDES: '{"api.openai.com":"http://127.0.0.1:9999"}',
      OPENAI_API_KEY: 'sk-o',
      ANTHROPIC_API_KEY: 'sk-a',
      GOOGLE_API_KEY: 'g',
      METRICS_TOKEN: 'scrape-0123456789abc',
    });
    expect(c).toMatchObject({
      port: 0,
      host: '0.0.0.0',
      databaseUrl: 'postgres://u:p@db:5432/tollgate',
      redisUrl: 'rediss://cache:6380',
      logLevel: 'debug',
      rateLimitPerMinute: 60,
      upstreamOverrides: { 'api.openai.com': 'http://127.0.0.1:9999' },
      providerKeys: { openai: 'sk-o', anthropic: 'sk-a', google: 'g' },
      metricsToken: 'scrape-0123456789abc',
    });
  });

  it('takes a read replica only beside a PostgreSQL DATABASE_URL', () => {
    expect(loadConfig({ DATABASE_URL: 'postgres://h/db', DATABASE_READ_URL: 'postgres://replica/db' }).databaseReadUrl).toBe('postgres://replica/db');
    expect(configError({ DATABASE_READ_URL: 'postgres://replica/db' }).message).toContain('DATABASE_READ_URL');
  });

  it('accepts postgresql:// as well as postgres://', () => {
    expect(loadConfig({ DATABASE_URL: 'postgresql://h/db' }).databaseUrl).toBe('postgresql://h/db');
  });

  it.each([
    ['PORT', 'abc'],
    ['PORT', '70000'],
    ['PORT', '80.5'],
    ['DATABASE_URL', 'mysql://x'],
    ['REDIS_URL', 'http://cache:6379'],
    ['DATABASE_READ_URL', 'sqlite:./replica.db'],
    ['LOG_LEVEL', 'loud'],
    ['SERVICE_CHARGE_RATE', '1.23456789012'],
    ['SERVICE_CHARGE_RATE', '-1'],
    ['RATE_LIMIT_PER_MINUTE', '0'],
    ['HEAP_GROWING_PERCENT', '0'],
    ['HEAP_GROWING_PERCENT', 'less'],
  ])('rejects %s=%s with a ConfigError naming the variable', (name, value) => {
    const err = configError({ [name]: value });
    expect(err.message).toContain(name);
  });

  it.each([
    ['not JSON', '{bad'],
    ['a JSON array', '["http://x"]'],
    ['a value that is not a URL', '{"api.openai.com":"nope"}'],
  ])('rejects UPSTREAM_OVERRIDES that is %s, naming it', (_label, value) => {
    const err = configError({ UPSTREAM_OVERRIDES: value });
    expect(err.message).toContain('UPSTREAM_OVERRIDES');
    expect(err.message).toMatch(/JSON object/);
  });

  it('rejects a PRICE_OVERRIDES_FILE that cannot be read, naming it', () => {
    const err = configError({ PRICE_OVERRIDES_FILE: '/nonexistent/tollgate-prices.json' });
    expect(err.message).toContain('PRICE_OVERRIDES_FILE');
  });

  it('names every offending variable at once', () => {
    const err = configError({ PORT: 'abc', DATABASE_URL: 'mysql://x', LOG_LEVEL: 'loud' });
    for (const name of ['PORT', 'DATABASE_URL', 'LOG_LEVEL']) expect(err.message).toContain(name);
  });

  it('rejects a METRICS_TOKEN too short to resist guessing, without repeating it', () => {
    const err = configError({ METRICS_TOKEN: 'short-tok' });
    expect(err.message).toContain('METRICS_TOKEN');
    expect(err.message).not.toContain('short-tok');
  });

  it('does not repeat a secret value in the error message', () => {
    const err = configError({ DATABASE_URL: 'mysql://root:hunter2@db/x' });
    expect(err.message).not.toContain('hunter2');
  });
});
