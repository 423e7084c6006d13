import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { limitHeapGrowth } from '../../src/main.ts';

const MAIN = fileURLToPath(new URL('../../src/main.ts', import.meta.url));

/**
 * A child process that sets (or not) the growing factor after start, as the server does, then
 * keeps objects long enough to be promoted and drops them: old-generation garbage, as a gateway
 * under load makes. Returns the most heap it saw in use.
 */
async function peakHeapMb(percent: number | null): Promise<{ set: boolean; peakMb: number }> {
  const script = `
    import v8 from 'node:v8';
    import { limitHeapGrowth } from ${JSON.stringify(MAIN)};
    const set = limitHeapGrowth(${JSON.stringify(percent)}, []);
    const kept = new Array(400_000);
    let peak = 0;
    for (let i = 0; i < 6_000_000; i++) {
      kept[i % kept.length] = { i, text: 'item ' + i, list: [i, i + 1] };
      if (i % 100_000 === 0) peak = Math.max(peak, v8.getHeapStatistics().used_heap_size);
    }
    console.log(JSON.stringify({ set, peakMb: Math.round(peak / 1048576) }));
  `;
  const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    env: { ...process.env, NODE_OPTIONS: '' },
  });
  return JSON.parse(stdout.trim().split('\n').pop()!) as { set: boolean; peakMb: number };
}

describe('limitHeapGrowth', () => {
  it('makes V8 collect old-generation garbage sooner, though set after the process started', async () => {
    const [unlimited, limited] = await Promise.all([peakHeapMb(null), peakHeapMb(30)]);
    expect(unlimited.set).toBe(false);
    expect(limited.set).toBe(true);
    expect(limited.peakMb).toBeLessThan(unlimited.peakMb * 0.7);
  }, 60_000);

  it('leaves the factor alone when the operator gave node one, in either spelling', () => {
    expect(limitHeapGrowth(30, ['--heap-growing-percent=50'])).toBe(false);
    expect(limitHeapGrowth(30, ['--max-old-space-size=512', '--heap_growing_percent=50'])).toBe(false);
  });

  it('sets nothing when turned off', () => {
    expect(limitHeapGrowth(null, [])).toBe(false);
  });
});
