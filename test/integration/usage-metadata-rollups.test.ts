import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { chargeBatch } from '../../src/ledger/charge-batch.ts';
import type { ChargeInput } from '../../src/ledger/charge.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { failRequest, SETTLE_JOB, settleRequest, type SettleInput } from '../../src/ledger/settlement/settle.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { findConnection } from '../../src/storage/connections.ts';
import { findMerchant } from '../../src/storage/merchants.ts';
import { findMeter } from '../../src/storage/meters.ts';
import { up as createMetadataRollups } from '../../src/storage/migrations/0007_usage_rollups_by_metadata.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { recountMetadataRollups, storedMetadataRollups } from '../helpers/usage-rollups.ts';
import { admissionOf, settlementOf, tokenUsage } from '../helpers/settle.ts';

/**
 * GET /usage with one metadata pair reads usage_rollups_by_metadata, so every path that records
 * usage must add to it exactly what a recount of the records gives, and the migration that
 * creates it must backfill the same from records stored before it.
 */
describe.each(databasesUnderTest())('usage rollups per metadata pair on %s', (dialect) => {
  let t: TestApp;
  const merchants: string[] = [];

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  /** Pairs shared between records, records with several pairs, and records with none. */
  const METADATA: Record<string, string>[] = [{ team: 'a', env: 'prod' }, { team: 'b' }, {}, { team: 'a' }, { env: 'prod', note: 'a\nvalue' }];

  /** A merchant billed through the gateway: admits pending records and builds their settlements. */
  async function forwardingMerchant(name: string, metadataOf: (i: number) => Record<string, string>) {
    const merchant = await t.newMerchant(name);
    merchants.push(merchant.merchantId);
    await creditWallet(t.storage, merchant.walletId, parseMoney('50'), new Date().toISOString());
    const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
    const record = (i: number) => ({ provider: 'openai', endpoint: 'POST x', provider_key_type: 'managed' as const, metadata: metadataOf(i) });
    const admit = async (i: number, at: string) => {
      const admitted = await admitRequest(
        t.storage,
        admissionOf(billing, merchant.walletId, { hold: '0.01', facts: record(i), ttlMs: 100 * 365 * 86_400_000, now: new Date(at) }),
      );
      if (admitted.outcome !== 'admitted') throw new Error(admitted.outcome);
      return { ...admitted, i };
    };
    const settlement = (a: Awaited<ReturnType<typeof admit>>): SettleInput =>
      settlementOf(a, {
        billing,
        usage: tokenUsage(500 + a.i, 200 + a.i),
        prices: { input: parseMoney('2.5'), output: parseMoney('10') },
        baseCostCharged: true,
        record: record(a.i),
      });
    return { merchantId: merchant.merchantId, admit, settlement };
  }

  it('POST /requests batches (group commit and concurrent HTTP) add to the metadata rollups what a recount gives', async () => {
    const m = await t.newMerchant('Batches');
    merchants.push(m.merchantId);
    const headers = t.auth(m.secretKey);
    const meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers,
        payload: { name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '2.5' }] },
      })
    ).json<{ meter_id: string; meter_slug: string }>();
    const customers: string[] = [];
    for (const fund of ['100', '100', '0']) {
      const c = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json<{ customer_id: string; wallet: { wallet_id: string } }>();
      if (fund !== '0') await creditWallet(t.storage, c.wallet.wallet_id, parseMoney(fund), new Date().toISOString());
      customers.push(c.customer_id);
    }
    const input = async (i: number, customer: number): Promise<ChargeInput> => ({ now: new Date(),
      merchant: (await findMerchant(t.storage, m.merchantId))!,
      connection: (await findConnection(t.storage, m.merchantId, customers[customer]!))!,
      meter: (await findMeter(t.storage, m.merchantId, meter.meter_id))!,
      requestId: `batch-${i}`,
      bodyHash: `hash-${i}`,
      usage: tokenUsage(1000 * (i + 1), 300 * i),
      provider: 'openai',
      model: 'gpt-4o',
      endpoint: 'POST /v1/requests',
      providerKeyType: 'managed',
      basePrices: { input: parseMoney('2'), output: parseMoney('8') },
      serviceChargeRate: parseMoney('10'),
      metadata: METADATA[i % METADATA.length]!,
    });

    // Two batches in one 15-minute bucket (the second adds to rows the first wrote), one in the
    // next; the unfunded customer's requests are refused and must add nothing.
    const batches: [string, number[]][] = [
      ['2026-03-31T23:44:00.000Z', [0, 1, 2, 3, 4, 5, 6]],
      ['2026-03-31T23:44:59.999Z', [7, 8, 9, 10]],
      ['2026-03-31T23:45:00.000Z', [11, 12, 13, 14, 15]],
    ];
    for (const [at, ids] of batches) {
      const outcomes = await chargeBatch(t.storage, await Promise.all(ids.map((i) => input(i, i % 3))), new Date(at));
      expect(outcomes.map((o) => o.outcome)).toEqual(ids.map((i) => (i % 3 === 2 ? 'insufficient_balance' : 'recorded')));
    }
    const posted = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        t.app.inject({
          method: 'POST',
          url: '/v1/requests',
          headers,
          payload: { request_id: `http-${i}`, customer_id: customers[i % 2], meter_slug: meter.meter_slug, input_tokens: 100 + i, metadata: METADATA[i % METADATA.length] },
        }),
      ),
    );
    expect(posted.map((r) => r.statusCode)).toEqual(posted.map(() => 201));

    const stored = await storedMetadataRollups(t.storage.db, [m.merchantId]);
    expect(stored.length).toBeGreaterThan(METADATA.length);
    expect(stored).toEqual(await recountMetadataRollups(t.storage.db, [m.merchantId]));
  });

  it('gateway settlements (alone, in a writer batch, failed) add to the metadata rollups what a recount gives; pending ones add nothing', async () => {
    const { merchantId, admit, settlement } = await forwardingMerchant('Forwarded', (i) => METADATA[i % METADATA.length]!);
    const admitted = [];
    for (let i = 0; i < 12; i++) admitted.push(await admit(i, `2026-04-01T00:${String(10 + i).padStart(2, '0')}:00.000Z`));
    const [alone, failed, , pending] = admitted;
    const batched = admitted.filter((a) => a !== alone && a !== failed && a !== pending);

    expect((await settleRequest(t.storage, settlement(alone!))).outcome).toBe('recorded');
    const outcomes = await t.storage.db.transaction().execute((trx) => SETTLE_JOB.inTransaction!(trx, t.storage.dialect, batched.map(settlement)));
    expect(outcomes.map((o) => o.outcome)).toEqual(batched.map(() => 'recorded'));
    await failRequest(t.storage, { now: new Date(), recordId: failed!.recordId, holdIds: failed!.holdIds });

    const stored = await storedMetadataRollups(t.storage.db, [merchantId]);
    expect(stored).toEqual(await recountMetadataRollups(t.storage.db, [merchantId]));
    // Admitted 00:10 to 00:14, in the 00:00 bucket: the settled, failed and batched records count
    // once per pair; the pending one (team=a) not at all, as it is not usage until it settles.
    const pairsOf = (i: number) => BigInt(Object.keys(METADATA[i % METADATA.length]!).length);
    expect(pairsOf(pending!.i)).toBeGreaterThan(0n);
    const inFirstBucket = stored.filter((r) => r.bucket_start === '2026-04-01T00:00:00.000Z');
    expect(inFirstBucket.reduce((n, r) => n + BigInt(r.requests), 0n)).toBe(pairsOf(0) + pairsOf(1) + pairsOf(2) + pairsOf(4));
  });

  it('a settlement batch whose metadata rollups are more values than a statement takes parameters is written whole, each record rolled up', async () => {
    // 64 settlements (the writer's largest batch) of 80 pairs of their own: 5,120 rollup rows, 71,680
    // values: one JSON parameter on PostgreSQL (limit 65,535), statements within 32,766 on SQLite.
    const eightyPairs = (i: number) => Object.fromEntries(Array.from({ length: 80 }, (_, k) => [`k${k}`, `v${i}`]));
    const { merchantId, admit, settlement } = await forwardingMerchant('Many pairs', eightyPairs);
    const admitted: Awaited<ReturnType<typeof admit>>[] = [];
    for (let i = 0; i < 64; i++) admitted.push(await admit(i, `2026-04-02T10:${String(i % 60).padStart(2, '0')}:00.000Z`));

    const outcomes = await t.storage.db.transaction().execute((trx) => SETTLE_JOB.inTransaction!(trx, t.storage.dialect, admitted.map(settlement)));

    expect(outcomes.map((o) => o.outcome)).toEqual(admitted.map(() => 'recorded'));
    const stored = await storedMetadataRollups(t.storage.db, [merchantId]);
    expect(stored.reduce((n, r) => n + BigInt(r.requests), 0n)).toBe(64n * 80n);
    expect(stored).toEqual(await recountMetadataRollups(t.storage.db, [merchantId]));
  });

  it('the migration backfills, from the stored records, exactly the rows the writers maintained', async () => {
    const maintained = await storedMetadataRollups(t.storage.db, merchants);
    expect(maintained.length).toBeGreaterThan(0);

    await sql`drop table usage_rollups_by_metadata`.execute(t.storage.db);
    await createMetadataRollups(t.storage.db as unknown as Kysely<unknown>);

    const backfilled = await storedMetadataRollups(t.storage.db, merchants);
    expect(backfilled).toEqual(maintained);
    expect(backfilled).toEqual(await recountMetadataRollups(t.storage.db, merchants));
  });
});
