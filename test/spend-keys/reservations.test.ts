import type { KyselyPlugin, PluginTransformQueryArgs, PluginTransformResultArgs, QueryResult, RootOperationNode, UnknownRow } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { newId } from '../../src/domain/ids.ts';
import { finishReservation, reserveForRequest } from '../../src/ledger/spend-key-limits.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

/**
 * A spend key's reservation ends exactly once with its request: at settlement (in the charge's
 * transaction), at failure, or by the hold sweeper when the request never finished.
 */
describe.each(databasesUnderTest())('spend key reservations on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    upstream = await startMockUpstream();
    t = await startTestApp(dialect, {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }),
        PROVIDER_KEYS: JSON.stringify({ openai: 'sk-openai-managed' }),
        HOLD_TTL_MS: '1000',
      },
    });
    base = await t.listen();
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('50'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const createKey = async () => {
    const res = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'r', spend_limit: { amount: '5', cycle: 'daily' } } });
    return res.json() as { key: string; spend_key_id: string };
  };
  const chat = (key: string) =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 50, messages: [{ role: 'user', content: 'hello there' }] }),
    });
  const keyRow = (id: string) => t.storage.db.selectFrom('spend_keys').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  const reservations = (id: string) => t.storage.db.selectFrom('spend_key_reservations').selectAll().where('spend_key_id', '=', id).execute();

  it('a request whose hold the sweeper expired has its reservation ended, once, counting the estimate it is charged; its late answer counts nothing more', async () => {
    const key = await createKey();
    upstream.setNext({ path: '/chat/completions', delayMs: 600 });
    const answer = chat(key.key);
    const reservation = await until(async () => (await reservations(key.spend_key_id))[0], 'a reservation for the request');
    expect(BigInt((await keyRow(key.spend_key_id)).reserved_spend)).toBe(BigInt(reservation.amount));

    expect(await sweepExpiredHolds(t.storage, new Date(t.clock.now() + 60_000))).toBe(1);
    expect(await reservations(key.spend_key_id)).toEqual([]);
    const swept = await keyRow(key.spend_key_id);
    expect(BigInt(swept.reserved_spend)).toBe(0n);
    // Its provider call may have been answered: it is charged the estimate it reserved (decision 0019).
    expect(BigInt(swept.current_spend)).toBe(BigInt(reservation.amount));

    const late = await answer;
    expect(late.status).toBe(200);
    // Its whole answer is out, so its settlement has started: wait for it instead of for time.
    await late.text();
    await t.app.gateway.settlements.drain();
    const after = await keyRow(key.spend_key_id);
    expect({ reserved: BigInt(after.reserved_spend), spend: BigInt(after.current_spend), requests: Number(after.total_requests) }).toEqual({
      reserved: 0n,
      spend: BigInt(reservation.amount),
      requests: 1,
    });
  });

  it('the sweeper ends a reservation left behind by a completed request, counting the cost its record shows', async () => {
    // This test's record is then the newest by created_at (the app's clock stands still otherwise).
    t.clock.advance(1000);
    const key = await createKey();
    expect((await chat(key.key)).status).toBe(200);
    await until(async () => (await reservations(key.spend_key_id)).length === 0, 'the reservation to end');
    const settled = await keyRow(key.spend_key_id);
    const cost = BigInt(settled.current_spend);
    expect(cost).toBeGreaterThan(0n);
    const record = await t.storage.db.selectFrom('requests').select(['id', 'status']).where('status', '=', 'completed').orderBy('created_at', 'desc').executeTakeFirstOrThrow();

    // As a process stopping between the charge and the reservation would have left it.
    const held = 12_345n;
    await t.storage.db
      .updateTable('spend_keys')
      .set({ current_spend: 0n, total_spend: BigInt(settled.total_spend) - cost, reserved_spend: held })
      .where('id', '=', key.spend_key_id)
      .execute();
    await t.storage.db.insertInto('spend_key_reservations').values({ request_pk: record.id, spend_key_id: key.spend_key_id, amount: held, created_at: dateOf(t.clock).toISOString() }).execute();

    await sweepExpiredHolds(t.storage, dateOf(t.clock));
    const repaired = await keyRow(key.spend_key_id);
    expect(await reservations(key.spend_key_id)).toEqual([]);
    expect({ reserved: BigInt(repaired.reserved_spend), spend: BigInt(repaired.current_spend), total: BigInt(repaired.total_spend) }).toEqual({
      reserved: 0n,
      spend: cost,
      total: BigInt(settled.total_spend),
    });
    // Ending it again changes nothing.
    await sweepExpiredHolds(t.storage, dateOf(t.clock));
    expect(BigInt((await keyRow(key.spend_key_id)).current_spend)).toBe(cost);
  });

  it('a key whose settled charge exceeded its reservation counts what its requests in flight may overrun against its limit: admitted while the limit covers that, refused past it; the first admission with nothing reserved ends the overrun (decision 0025)', async () => {
    // The key's own rule, apart from its wallet's. The limit is 5.
    const key = await createKey();
    const amount = parseMoney('0.001');
    const now = dateOf(t.clock);
    const reserve = async (reserved = amount) => {
      const recordId = newId('request');
      const refusal = await t.storage.db.transaction().execute(async (trx) => reserveForRequest(trx, await keyRow(key.spend_key_id), { recordId, amount: reserved, now }));
      return { recordId, refusal };
    };
    const finish = (recordId: string, spend: bigint) => t.storage.db.transaction().execute((trx) => finishReservation(trx, t.storage.dialect, recordId, spend, now));

    const first = await reserve();
    const second = await reserve();
    expect([first.refusal, second.refusal]).toEqual([null, null]);
    // Charged at most what it reserved: no overrun.
    await finish(first.recordId, amount);
    expect(Number((await keyRow(key.spend_key_id)).overrun)).toBe(0);
    const third = await reserve();
    expect(third.refusal).toBeNull();

    // Charged 40 times what it reserved (39,000 per thousand beyond), with another request still reserved.
    await finish(second.recordId, amount * 40n);
    expect(Number((await keyRow(key.spend_key_id)).overrun)).toBe(39_000);
    // Spent 0.041, reserved 0.001: a request reserving 0.1 may cost 39 × (0.001 + 0.1) more: 4.081 in all fits in 5.
    const fits = await reserve(parseMoney('0.1'));
    expect(fits.refusal).toBeNull();
    await finish(fits.recordId, 0n);
    // One reserving 0.2 would fit the limit by its reservation (0.242), not with what may overrun (+7.839).
    const refused = await reserve(parseMoney('0.2'));
    expect(refused.refusal).toMatchObject({ code: 'spend_limit_reached', message: expect.stringContaining('in flight') });
    expect((await reservations(key.spend_key_id)).map((r) => r.request_pk)).toEqual([third.recordId]);
    expect(BigInt((await keyRow(key.spend_key_id)).reserved_spend)).toBe(amount);

    // Nothing in flight any more: admitted, and the overrun is over.
    await finish(third.recordId, amount);
    const admitted = await reserve(parseMoney('0.2'));
    expect(admitted.refusal).toBeNull();
    const after = await keyRow(key.spend_key_id);
    expect({ overrun: Number(after.overrun), reserved: BigInt(after.reserved_spend), spend: BigInt(after.current_spend) }).toEqual({
      overrun: 0,
      reserved: parseMoney('0.2'),
      spend: amount * 42n,
    });
    await finish(admitted.recordId, 0n);
  });

  it('settlement ends the reservation in the transaction that charges the request: a failure between them leaves neither', async () => {
    const key = await createKey();
    const original = t.storage.db;
    // As if the process died just as the reservation was to end: that statement never runs.
    const failing = new FailingReservationEnd();
    t.storage.db = original.withPlugin(failing);
    try {
      expect((await chat(key.key)).status).toBe(200);
      // The settlement has tried (and failed) to end the reservation with the charge.
      await until(() => failing.failures > 0, 'the failing write to be tried');
      const [reservation] = await reservations(key.spend_key_id);
      expect(reservation).toBeDefined();
      const record = await t.storage.db.selectFrom('requests').select('status').where('id', '=', reservation!.request_pk).executeTakeFirstOrThrow();
      // Never charged while still reserved: the charge rolled back with the reservation's end.
      expect(record.status).toBe('pending');
      expect(BigInt((await keyRow(key.spend_key_id)).current_spend)).toBe(0n);
    } finally {
      t.storage.db = original;
    }
  });
});

/** Fails every statement that deletes spend-key reservations. */
class FailingReservationEnd implements KyselyPlugin {
  failures = 0;
  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    if (args.node.kind === 'DeleteQueryNode' && JSON.stringify(args.node.from).includes('"spend_key_reservations"')) {
      this.failures++;
      throw new Error('simulated crash before the reservation ends');
    }
    return args.node;
  }
  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    return args.result;
  }
}
