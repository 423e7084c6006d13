import { readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT, sourceFiles } from '../helpers/comment-references.ts';
import { LONGEST_SLEEP_MS, wallClockWaitsIn } from '../helpers/wall-clock-waits.ts';

/**
 * A test proves what it claims by moving the app's TestClock or by waiting for the event it is
 * about, never by sleeping and hoping the other side was quick enough: no sleep over 50 ms, no
 * loop that polls by sleeping, and one `until` helper (test/helpers/until.ts) for every wait on
 * something happening in the background.
 */

const UNTIL_HELPER = join(REPO_ROOT, 'test/helpers/until.ts');

describe('waits in the test suite', () => {
  it(`no test sleeps more than ${LONGEST_SLEEP_MS} ms, polls in a sleeping loop, or waits with a home-made until`, () => {
    const found = sourceFiles(['test'])
      .filter((file) => file !== UNTIL_HELPER)
      .flatMap((file) => wallClockWaitsIn(file, readFileSync(file, 'utf8')).map((w) => `${relative(REPO_ROOT, file)}:${w.line} ${w.kind}: ${w.text}`));
    expect(found).toEqual([]);
  });
});

describe('the wait check itself', () => {
  const check = (source: string) => wallClockWaitsIn('example.test.ts', source).map((w) => `${w.line} ${w.kind}`);

  it('flags long sleeps in every spelling, sleeps of a length the file does not fix, and sleeping loops', () => {
    const source = [
      "import { setTimeout as nap } from 'node:timers/promises';",
      'const SETTLE_MS = 1_500;',
      'await new Promise((r) => setTimeout(r, 100));',
      'await nap(SETTLE_MS);',
      'await sleep(ms);',
      'await pause(SETTLE_MS / 10 + 1);',
      'while (!done) await nap(10);',
      'for (let i = 0; i < 5 && !done; i++) await new Promise((resolve) => setTimeout(resolve, 5));',
    ].join('\n');
    expect(check(source)).toEqual(['3 sleep', '4 sleep', '5 sleep', '6 sleep', '7 poll loop', '8 poll loop']);
  });

  it('flags a second until helper by any of its usual names', () => {
    const source = ['async function until(check) {}', 'const waitUntil = async () => {};', 'const eventually = function () {};', 'function waitForFile() {}'].join('\n');
    expect(check(source)).toEqual(['1 until helper', '2 until helper', '3 until helper', '4 until helper']);
  });

  it('leaves short sleeps, deadlines, callbacks and waits marked as being about wall time', () => {
    const source = [
      'await new Promise((r) => setTimeout(r, 50));',
      "const hung = new Promise((resolve) => setTimeout(() => resolve('hung'), 2_000));",
      'setTimeout(() => socket.end(), 300);',
      '// Wall clock: the provider takes this long to answer.',
      'await sleep(behaviour.delayMs);',
      'await sleep(delay); // wall clock: a slow receiver',
      "const text = 'await sleep(1000)';",
      'const nap = (ms) => new Promise((r) => setTimeout(r, ms));',
    ].join('\n');
    expect(check(source)).toEqual([]);
  });
});
