import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import type { MockGateway } from '../helpers/gateway.ts';
import { leaksInSuiteLogs, printFigures, startSuiteGateway } from './harness.ts';

/**
 * Idempotency race: 100 concurrent POSTs with one Idempotency-Key over loopback HTTP make exactly
 * one resource; every answer is the first response, its replay, or 409 `idempotency_key_in_use`.
 */

const RACERS = 100;

describe.each(databasesUnderTest())('idempotency race on %s', (dialect) => {
  let gw: MockGateway;
  beforeAll(async () => {
    gw = await startSuiteGateway(dialect);
  });
  afterAll(async () => {
    await gw?.t.close();
    await gw?.upstream.close();
  });

  it(`${RACERS} concurrent requests with one key create one customer`, async () => {
    const countCustomers = async () => Number((await gw.t.storage.db.selectFrom('connections').select((eb) => eb.fn.countAll().as('n')).executeTakeFirstOrThrow()).n);
    const before = await countCustomers();
    const answers = await Promise.all(
      Array.from({ length: RACERS }, async () => {
        const res = await fetch(`${gw.base}/v1/customers`, {
          method: 'POST',
          headers: { ...gw.t.auth(), 'content-type': 'application/json', 'idempotency-key': `race-${dialect}` },
          body: JSON.stringify({ name: 'Racer', reference_id: `race-${dialect}` }),
        });
        return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', body: (await res.json()) as Record<string, unknown> };
      }),
    );
    const created = answers.filter((a) => a.status === 201 && !a.replayed);
    const replayed = answers.filter((a) => a.replayed);
    const inUse = answers.filter((a) => a.status === 409 && (a.body.error as { code?: string } | undefined)?.code === 'idempotency_key_in_use');
    const discrepancies = answers.length - created.length - replayed.length - inUse.length + Math.abs(created.length - 1) + Math.abs((await countCustomers()) - before - 1);
    printFigures(`idempotency race (${dialect})`, { requests: RACERS, created: created.length, replayed: replayed.length, in_use_409: inUse.length, discrepancies });
    expect(created).toHaveLength(1);
    for (const r of replayed) expect(r.body).toEqual(created[0]!.body);
    expect(created.length + replayed.length + inUse.length).toBe(RACERS);
    expect(await countCustomers()).toBe(before + 1);
    expect(discrepancies).toBe(0);
  });

  it('logged no secret, key or e-mail address', () => {
    expect(leaksInSuiteLogs().leaks).toEqual([]);
  });
});
