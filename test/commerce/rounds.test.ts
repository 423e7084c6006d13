import { describe, expect, it } from 'vitest';
import { runEveryInterval } from '../../src/commerce/rounds.ts';
import { until } from '../helpers/until.ts';

/** The background loop the renewal engine and the payment reconciliation share. */
describe('runEveryInterval', () => {
  it('never starts a round while one is running, and stop tells the running round and waits for it', async () => {
    let started = 0;
    let inRound = 0;
    let overlapped = false;
    let finish: () => void = () => {};
    let sawStopping = false;
    const loop = runEveryInterval(
      2,
      async (stopping) => {
        started += 1;
        inRound += 1;
        if (inRound > 1) overlapped = true;
        await new Promise<void>((resolve) => {
          finish = resolve;
        });
        sawStopping = stopping();
        inRound -= 1;
      },
      () => {},
    );
    await until(() => started === 1, 'the first round to start');
    // Wall clock: several 2 ms intervals pass while the first round is still running; none starts another.
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(started).toBe(1);
    const stopped = loop.stop();
    finish();
    await stopped;
    expect(sawStopping).toBe(true);
    expect(inRound).toBe(0);
    expect(overlapped).toBe(false);
  });

  it('reports a failed round and keeps running', async () => {
    const errors: unknown[] = [];
    let rounds = 0;
    const loop = runEveryInterval(
      2,
      async () => {
        rounds += 1;
        throw new Error(`round ${rounds}`);
      },
      (err) => errors.push(err),
    );
    await until(() => rounds >= 2, 'a round after a failed one');
    await loop.stop();
    expect(errors.length).toBeGreaterThanOrEqual(1);
    expect((errors[0] as Error).message).toBe('round 1');
  });
});
