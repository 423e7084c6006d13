import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';

const run = promisify(execFile);
const README = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const SECTION = '### A first billed call, offline';
/** The address the README's commands name: the server `npm start` starts. */
const README_SERVER = 'http://127.0.0.1:8080';

/** The first fenced block of `language` after `heading` in the README. */
function blockAfter(heading: string, language: string): string {
  const at = README.indexOf(heading);
  if (at === -1) throw new Error(`README.md has no "${heading}"`);
  const fence = '```' + language + '\n';
  const start = README.indexOf(fence, at);
  const end = README.indexOf('\n```', start + fence.length);
  return README.slice(start + fence.length, end + 1);
}

/** A line of the README's shown output as a pattern: `…` stands for any ids and times. */
function linePattern(line: string): RegExp {
  const parts = line.split('…').map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  return new RegExp(`^${parts.join('.+?')}$`);
}

/**
 * The README's quick start, run as written by bash — its CLI, curl and demo provider — against a
 * server on loopback (the address `npm start` listens on replaced by this server's), and its output
 * held to the output the README shows, line by line.
 */
describe('the README quick start', () => {
  let t: TestApp;
  let base: string;
  beforeAll(async () => {
    t = await startTestApp('sqlite');
    base = await t.listen();
  });
  afterAll(async () => t?.close());

  it('goes from a new merchant to a billed demo call and its record, printing what the README shows', { timeout: 180_000 }, async () => {
    const script = blockAfter(SECTION, 'sh');
    expect(script).toContain(README_SERVER);
    // After the README's commands, the test asks for the secret key they made (on stderr), to read the record with it.
    const withKey = `${script.replaceAll(README_SERVER, base)}printf %s "$TOLLGATE_SECRET_KEY" >&2\n`;
    const { stdout, stderr } = await run('bash', ['-euo', 'pipefail', '-c', withKey], {
      env: {
        PATH: process.env.PATH!,
        HOME: process.env.HOME ?? tmpdir(),
        // The server's database, which `tollgate admin` writes to as it would to ./data/tollgate.db.
        DATABASE_URL: t.database.url,
        TOLLGATE_API_URL: base,
        LOG_LEVEL: 'silent',
        XDG_CONFIG_HOME: join(tmpdir(), 'tollgate-test-no-config'),
      },
      cwd: new URL('../..', import.meta.url),
      timeout: 170_000,
    });

    const printed = stdout.trimEnd().split('\n');
    const shown = blockAfter(SECTION, 'text').trimEnd().split('\n');
    expect(printed).toHaveLength(shown.length);
    shown.forEach((line, i) => expect(printed[i]).toMatch(linePattern(line)));

    // The record the last line shows is the one the server settled, charged to the new customer.
    const requestId = printed.at(-1)!.split(/\s+/)[0]!;
    const record = await t.settledRecord(requestId, { authorization: `Bearer ${stderr.trim().split('\n').at(-1)}` });
    expect(record).toMatchObject({ status: 'completed', provider: 'demo', model: 'demo-chat', total_wallet_cost: '0.0000460000' });
  });
});
