import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { CHARGE_JOB, chargeBatch, chargeWriter } from '../../src/ledger/charge-batch.ts';
import type { ChargeInput } from '../../src/ledger/charge.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet, UnwrittenHolds } from '../../src/ledger/wallets.ts';
import { findConnection, softDeleteConnection } from '../../src/storage/connections.ts';
import { findMerchant } from '../../src/storage/merchants.ts';
import { findMeter, softDeleteMeter, updateMeter } from '../../src/storage/meters.ts';
import { findRequestByRequestId } from '../../src/storage/requests.ts';
import { serializeTiers } from '../../src/domain/meters.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createPlan, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const usd = parseMoney;
const tokens = (input: number, output = 0) => ({
  inputTokens: input,
  outputTokens: output,
  inputCharacters: 0,
  outputCharacters: 0,
  inputSeconds: '0',
  outputSeconds: '0',
});

/**
 * POST /requests charges concurrent requests together (group commit). Each request must still be
 * decided as if it were alone, in arrival order: a refusal, a duplicate or a deleted customer in a
 * batch changes nothing for the other requests, and nothing is written for it.
 */
describe.each(databasesUnderTest())('batched request charges on %s', (dialect) => {
  let t: TestApp;
  let second: TestApp;
  let sequence = 0;

  beforeAll(async () => {
    t = await startTestApp(dialect);
    second = await startTestApp(dialect, { database: t.database });
  });
  afterAll(async () => {
    await second?.close();
    await t?.close();
  });
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  /** A merchant with a meter (by default 2.5 per 1M tokens, 5 from 1,000 tokens on) and customers funded as given. */
  async function setup(funds: string[], tiers = [{ start: 0, rate: '2.5' }, { start: 1000, rate: '5' }]) {
    const m = await t.newMerchant();
    const headers = t.auth(m.secretKey);
    const meter = (
      await t.app.inject({ method: 'POST', url: '/v1/meters', headers, payload: { name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers } })
    ).json<{ meter_id: string; meter_slug: string }>();
    const customers: { id: string; walletId: string }[] = [];
    for (const fund of funds) {
      const c = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: {} })).json<{
        customer_id: string;
        wallet: { wallet_id: string };
      }>();
      if (usd(fund) > 0n) await creditWallet(t.storage, c.wallet.wallet_id, usd(fund), new Date().toISOString());
      customers.push({ id: c.customer_id, walletId: c.wallet.wallet_id });
    }
    const balance = async (i: number) => (await findWallet(t.storage, customers[i]!.walletId))!.balance;
    /** The input POST /requests hands the writer, as the route builds it. */
    const input = async (customer: number, usage = tokens(0), requestId = `batch-${++sequence}`): Promise<ChargeInput> => ({ now: new Date(),
      merchant: (await findMerchant(t.storage, m.merchantId))!,
      connection: (await findConnection(t.storage, m.merchantId, customers[customer]!.id))!,
      meter: (await findMeter(t.storage, m.merchantId, meter.meter_id))!,
      requestId,
      bodyHash: `hash-of-${requestId}`,
      usage,
      provider: 'custom',
      model: null,
      endpoint: 'POST /v1/requests',
      providerKeyType: 'managed',
      basePrices: null,
      serviceChargeRate: 0n,
      metadata: { run: 'batch' },
    });
    const post = (app: TestApp, body: object) => app.app.inject({ method: 'POST', url: '/v1/requests', headers, payload: body });
    return { m, headers, meter, customers, balance, input, post };
  }

  it('refuses the request its wallet cannot pay and records the others of the same batch', async () => {
    const s = await setup(['0.01', '0.0000001']);
    const inputs = [await s.input(0, tokens(1000)), await s.input(1, tokens(1000)), await s.input(0, tokens(1000))];
    const outcomes = await chargeBatch(t.storage, inputs);

    expect(outcomes.map((o) => o.outcome)).toEqual(['recorded', 'insufficient_balance', 'recorded']);
    expect(outcomes[1]).toMatchObject({ payer: 'wallet', needed: usd('0.0025'), available: usd('0.0000001') });
    // 1,000 tokens at 2.5, then 1,000 at 5 (the first request moved the customer past the tier start).
    expect(await s.balance(0)).toBe(usd('0.01') - usd('0.0025') - usd('0.005'));
    expect(await s.balance(1)).toBe(usd('0.0000001'));
    expect(await findRequestByRequestId(t.storage.db, s.m.merchantId, inputs[1]!.requestId)).toBeUndefined();
  });

  it("leaves the holds its app admitted in process and has not written; another app's are not its to see", async () => {
    const s = await setup(['0.01']);
    const thisApp = new UnwrittenHolds();
    thisApp.reserve(s.customers[0]!.walletId, usd('0.009'));
    // 1,000 tokens at 2.5 per 1M cost 0.0025: more than the 0.001 this app has not promised.
    const refused = await chargeBatch(t.storage, [Object.assign(await s.input(0, tokens(1000)), { unwritten: thisApp })]);
    expect(refused[0]).toMatchObject({ outcome: 'insufficient_balance', available: usd('0.001') });
    const otherApp = new UnwrittenHolds();
    const charged = await chargeBatch(t.storage, [Object.assign(await s.input(0, tokens(1000)), { unwritten: otherApp })]);
    expect(charged[0]!.outcome).toBe('recorded');
  });

  it('prices requests of one customer in arrival order, and a refused request moves no tier position', async () => {
    const s = await setup(['100']);
    const tooLarge = tokens(Number.MAX_SAFE_INTEGER);
    const outcomes = await chargeBatch(t.storage, [await s.input(0, tokens(600)), await s.input(0, tooLarge), await s.input(0, tokens(600))]);

    expect(outcomes.map((o) => o.outcome)).toEqual(['recorded', 'amount_too_large', 'recorded']);
    const third = outcomes[2]!;
    if (third.outcome !== 'recorded') throw new Error('expected a record');
    // Position 600: 400 tokens left in the first tier, 200 in the second.
    expect(third.priced.fee.breakdown.map((b) => [b.tokens, b.cost])).toEqual([
      [400, usd('0.001')],
      [200, usd('0.001')],
    ]);
  });

  it('answers duplicate for a request_id recorded before and still records the rest of the batch', async () => {
    const s = await setup(['1']);
    const first = await s.input(0, tokens(1000), 'already-here');
    expect((await chargeBatch(t.storage, [first]))[0]!.outcome).toBe('recorded');

    const outcomes = await chargeBatch(t.storage, [await s.input(0, tokens(1000), 'already-here'), await s.input(0, tokens(1000))]);

    expect(outcomes.map((o) => o.outcome)).toEqual(['duplicate', 'recorded']);
    // Charged twice in all: the first request and the new one, never the duplicate.
    expect(await s.balance(0)).toBe(usd('1') - usd('0.0025') - usd('0.005'));
  });

  it('records one of two copies of a request_id in the same batch', async () => {
    const s = await setup(['1']);
    const outcomes = await chargeBatch(t.storage, [await s.input(0, tokens(10), 'twice'), await s.input(0, tokens(10), 'twice')]);

    expect(outcomes.map((o) => o.outcome).sort()).toEqual(['duplicate', 'recorded']);
    expect(await s.balance(0)).toBe(usd('1') - usd('0.000025'));
  });

  it('keeps a copy of a request_id out of its first one\'s batch: a duplicate once that one is recorded, tried in the next batch when it was refused', async () => {
    const s = await setup(['0.003']);
    const sizes: number[] = [];
    const counted: typeof CHARGE_JOB = { ...CHARGE_JOB, wholeBatch: (storage, inputs) => (sizes.push(inputs.length), CHARGE_JOB.wholeBatch!(storage, inputs)) };
    const writer = chargeWriter(t.storage);

    // Handed in together: the copy waits for its first, the other request shares the first's batch.
    const inputs = [await s.input(0, tokens(10), 'copied'), await s.input(0, tokens(10), 'copied'), await s.input(0, tokens(10), 'other')];
    const recorded = await Promise.all(inputs.map((input) => writer.run(counted, input)));
    expect(recorded.map((o) => o.outcome)).toEqual(['recorded', 'duplicate', 'recorded']);
    expect(sizes).toEqual([2]);

    // The first asks for 2,000 tokens (0.00755), more than the 0.00295 left, and is refused; its copy
    // (1,000 tokens, 0.00255) is tried in the next batch and recorded, not answered as a duplicate.
    sizes.length = 0;
    const [big, small] = [await s.input(0, tokens(2000), 'retried-copy'), await s.input(0, tokens(1000), 'retried-copy')];
    const [refused, copy] = await Promise.all([writer.run(counted, big), writer.run(counted, small)]);
    expect(refused.outcome).toBe('insufficient_balance');
    expect(copy.outcome).toBe('recorded');
    expect(sizes).toEqual([1, 1]);
    await writer.drain();
  });

  it('charges nothing to a customer deleted after it was looked up, and prices with the meter as it is now', async () => {
    const s = await setup(['1', '1']);
    const stale = await s.input(0, tokens(1000));
    const current = await s.input(1, tokens(1000));
    await t.storage.db.transaction().execute((trx) => softDeleteConnection(trx, s.m.merchantId, s.customers[0]!.id, new Date().toISOString()));
    await updateMeter(t.storage, s.m.merchantId, s.meter.meter_id, { tiers: serializeTiers([{ start: 0, rate: usd('10') }]) });

    const outcomes = await chargeBatch(t.storage, [stale, current]);

    expect(outcomes.map((o) => o.outcome)).toEqual(['customer_deleted', 'recorded']);
    expect(await s.balance(0)).toBe(usd('1'));
    expect(await s.balance(1)).toBe(usd('1') - usd('0.01'));

    await softDeleteMeter(t.storage, s.m.merchantId, s.meter.meter_id, new Date().toISOString());
    expect((await chargeBatch(t.storage, [await s.input(1, tokens(1000))]))[0]).toEqual({ outcome: 'meter_deleted' });
  });

  it.runIf(dialect === 'postgres')('reads meters in its lock statement as JSON rows, which keep every column exactly only while each is text', async () => {
    const { rows } = await sql<{ column_name: string; data_type: string }>`
      select column_name, data_type from information_schema.columns where table_schema = current_schema() and table_name = 'meters'`.execute(t.storage.db);
    expect(rows.length).toBeGreaterThan(0);
    // A numeric column would come back as a JSON number, rounded past 2^53: read it as text there first.
    expect(rows.filter((r) => r.data_type !== 'text')).toEqual([]);
  });

  it('charges each request alone when its batch fails as a whole, so one bad request fails only itself', async () => {
    const s = await setup(['1']);
    const failures: unknown[] = [];
    const writer = chargeWriter(t.storage, { warn: (obj: { err: unknown }) => failures.push(obj.err) });
    const broken = { ...(await s.input(0, tokens(10))), merchant: { id: s.m.merchantId, wallet_id: 'wal_missing' } };
    // No customer: the merchant's (here missing) wallet would pay, and the batch cannot find it.
    broken.connection = null;

    const [one, other] = [await s.input(0, tokens(10)), await s.input(0, tokens(10))];
    // Handed in together, so they share a batch.
    const [good, bad, alsoGood] = await Promise.allSettled([writer.run(CHARGE_JOB, one), writer.run(CHARGE_JOB, broken), writer.run(CHARGE_JOB, other)]);

    expect(good).toMatchObject({ status: 'fulfilled', value: { outcome: 'recorded' } });
    expect(alsoGood).toMatchObject({ status: 'fulfilled', value: { outcome: 'recorded' } });
    expect(bad.status).toBe('rejected');
    expect(failures).toHaveLength(1);
    expect(await s.balance(0)).toBe(usd('1') - 2n * usd('0.000025'));
  });

  it('splits requests waiting together into batches small enough for the engine: 80 requests of 100 metadata pairs', async () => {
    const s = await setup(['1']);
    const failures: unknown[] = [];
    const writer = chargeWriter(t.storage, { warn: (obj: { err: unknown }) => failures.push(obj.err) });
    const metadata = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`key_${i}`, `value ${i}`]));
    const inputs = await Promise.all(Array.from({ length: 80 }, async () => ({ ...(await s.input(0, tokens(10))), metadata })));

    const outcomes = await Promise.all(inputs.map((input) => writer.run(CHARGE_JOB, input)));

    expect(outcomes.every((o) => o.outcome === 'recorded')).toBe(true);
    expect(failures).toEqual([]);
    expect(await s.balance(0)).toBe(usd('1') - 80n * usd('0.000025'));
  });

  it('answers a retried request with its record even when its wallet can no longer pay or its customer is gone', async () => {
    const s = await setup(['0.0025']);
    const body = { request_id: 'retried', customer_id: s.customers[0]!.id, meter_slug: s.meter.meter_slug, input_tokens: 1000 };
    const created = await s.post(t, body);
    expect(created.statusCode).toBe(201);
    expect(await s.balance(0)).toBe(0n);

    const again = await s.post(t, body);
    expect(again.statusCode).toBe(200);
    expect(again.json()).toEqual(created.json());
    expect((await s.post(t, { ...body, input_tokens: 999 })).json().error.code).toBe('request_id_conflict');

    await t.app.inject({ method: 'DELETE', url: `/v1/customers/${s.customers[0]!.id}`, headers: s.headers });
    expect((await s.post(t, body)).statusCode).toBe(200);
    const fresh = await s.post(t, { ...body, request_id: 'after-delete' });
    expect(fresh.statusCode).toBe(404);
  });

  it('applies a tier change made on another instance to the next request of a customer used before', async () => {
    const s = await setup(['1']);
    const body = (id: string) => ({ request_id: id, customer_id: s.customers[0]!.id, meter_slug: s.meter.meter_slug, input_tokens: 100 });
    expect((await s.post(t, body('before-change'))).json().fee.amount).toBe('0.0002500000');

    const patched = await second.app.inject({
      method: 'PATCH',
      url: `/v1/meters/${s.meter.meter_id}`,
      headers: s.headers,
      payload: { tiers: [{ start: 0, rate: '10' }] },
    });
    expect(patched.statusCode).toBe(200);

    expect((await s.post(t, body('after-change'))).json().fee.amount).toBe('0.0010000000');
  });

  it('records each request_id once when two instances receive the same requests at once', async () => {
    const s = await setup(['1', '1']);
    const bodies = Array.from({ length: 20 }, (_, i) => ({
      request_id: `both-${i}`,
      customer_id: s.customers[i % 2]!.id,
      meter_slug: s.meter.meter_slug,
      input_tokens: 100,
    }));
    const [urlA, urlB] = [await t.listen(), await second.listen()];
    const send = (url: string, body: object) =>
      fetch(`${url}/v1/requests`, { method: 'POST', headers: { ...s.headers, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    // Each id goes to both instances, in opposite orders.
    const responses = await Promise.all([...bodies.map((b) => send(urlA, b)), ...[...bodies].reverse().map((b) => send(urlB, b))]);

    const statuses = responses.map((r) => r.status);
    expect(statuses.filter((x) => x === 201)).toHaveLength(20);
    expect(statuses.filter((x) => x === 200)).toHaveLength(20);
    expect(await s.balance(0)).toBe(usd('1') - 10n * usd('0.00025'));
    expect(await s.balance(1)).toBe(usd('1') - 10n * usd('0.00025'));
  });

  it('decides under its locks which requests draw plan credit: a linked meter of the live subscription, whatever the caller claims', async () => {
    const s = await setup(['0.01']);
    const other = (
      await t.app.inject({ method: 'POST', url: '/v1/meters', headers: s.headers, payload: { name: 'Other', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '2.5' }] } })
    ).json<{ meter_id: string }>();
    const plan = await createPlan(t, { name: 'Linked', period_amount: '0', included_credit: '0.004', billing_interval: 'month', meter_ids: [s.meter.meter_id] }, s.m.secretKey);
    expect((await subscribe(t, s.customers[0]!.id, plan.plan_id, s.m.secretKey)).statusCode).toBe(201);
    const onOther = async (claim: boolean) =>
      Object.assign(await s.input(0, tokens(1000)), { meter: (await findMeter(t.storage, s.m.merchantId, other.meter_id))!, drawsPlanCredit: claim });

    // 1,000 tokens at 2.5 per 1M on each meter: the linked one from cycle credit (no flag given),
    // the other from prepaid although the caller says it draws plan credit.
    const outcomes = await chargeBatch(t.storage, [await s.input(0, tokens(1000)), await onOther(true)]);
    expect(outcomes.map((o) => o.outcome)).toEqual(['recorded', 'recorded']);
    expect(await walletBuckets(t.storage, s.customers[0]!.walletId)).toMatchObject({ cycle: usd('0.0015'), prepaid: usd('0.0075') });

    // A refusal says what the batch decided, for auto top-up: 4M tokens on the linked meter
    // (past its tier start: 10.0025) and on the other (10) are more than either may take.
    const refused = await chargeBatch(t.storage, [await s.input(0, tokens(4_000_000)), Object.assign(await onOther(true), { usage: tokens(4_000_000) })]);
    expect(refused).toMatchObject([
      { outcome: 'insufficient_balance', payer: 'wallet', available: usd('0.009'), drawsPlanCredit: true },
      { outcome: 'insufficient_balance', payer: 'wallet', available: usd('0.0075'), drawsPlanCredit: false },
    ]);
  });
});
