import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { sweepExpiredHolds } from '../../src/gateway/settle.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { forwardToken } from '../helpers/app.ts';
import { runTempDir, type TestDatabase } from '../helpers/databases.ts';
import { printFigures, referencesChargedTwice, startServe, useServeSuite } from './harness.ts';
import { until } from '../helpers/until.ts';

/**
 * No served call is free after a crash (decision 0024): a real `tollgate serve` process is
 * SIGKILLed again and again while clients forward calls as fast as it answers — with deferred
 * admission (SQLite), and with hot wallets admitted from leases (PostgreSQL, Redis on) — and
 * restarted each time. The calls the provider received are counted at the mock upstream; after the
 * last restart each of them has exactly one record, settled and charged, with no charge twice and
 * no sweep of expired holds needed for any of them: the restarted process replays its call journal.
 */

const ENGINES: TestDatabase['dialect'][] = process.env.TEST_DATABASE_URL ? ['sqlite', 'postgres'] : ['sqlite'];
const CLIENTS = 12;
const KILLS = 4;
/** Answers per life before the kill: enough for a hot wallet's lease (32 admissions a second) to be in use. */
const ANSWERS_PER_LIFE = 120;
/** Long: a served call must be settled by the restart's replay, not by the sweep of expired holds. */
const HOLD_TTL_MS = 600_000;
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.each(ENGINES)('crash test: calls served before a SIGKILL are charged after the restart (%s)', (dialect) => {
  const redis: Record<string, string> = dialect === 'postgres' && process.env.TEST_REDIS_URL ? { REDIS_URL: process.env.TEST_REDIS_URL } : {};
  const suite = useServeSuite(dialect, 'sk-managed-served-calls', { CALL_JOURNAL_DIR: runTempDir(), HOLD_TTL_MS: String(HOLD_TTL_MS), ...redis });

  it('leaves no served call without its one charge, over repeated kills', async () => {
    const { storage, base, upstream } = suite;
    const { merchant, secretKey } = await createMerchant(storage, { name: 'Served calls' }, new Date().toISOString());
    suite.serve = await startServe(suite.env, base);
    const auth = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
    const json = async (path: string, body: unknown) => (await fetch(`${base}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) })).json();
    const customer = await json('/v1/customers', { name: 'Served calls customer' });
    const meter = await json('/v1/meters', { name: 'm', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.01' }] });
    const GRANT = parseMoney('1000');
    await creditWallet(storage, customer.wallet.wallet_id, GRANT, new Date().toISOString());
    await creditWallet(storage, merchant.wallet_id, parseMoney('1000'), new Date().toISOString());
    const token = forwardToken(secretKey, customer.customer_id, meter.meter_slug);
    upstream.reset();

    /** Calls whose answer the client read in full: their relay ended, so their final usage is known. */
    const answered = new Set<string>();
    let sequence = 0;
    let failedAtKill = 0;
    let output = '';
    for (let life = 0; life < KILLS; life++) {
      if (!suite.serve) suite.serve = await startServe(suite.env, base);
      let answers = 0;
      let stop = false;
      const client = async () => {
        while (!stop) {
          const call = `call-${sequence++}`;
          try {
            const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
              method: 'POST',
              headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'x-service-metadata': JSON.stringify({ call }) },
              body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: call }], max_tokens: 5 }),
            });
            await res.arrayBuffer();
            if (res.status === 200) answered.add(call);
          } catch {
            failedAtKill++;
          }
          answers++;
        }
      };
      const clients = Array.from({ length: CLIENTS }, client);
      await until(() => answers >= ANSWERS_PER_LIFE, `${ANSWERS_PER_LIFE} answers in life ${life}`, { timeoutMs: 60_000, intervalMs: 5 });
      // Wall clock: a different moment of the request cycle each time (0 to 21 ms).
      await pause(life * 7);
      suite.serve.child.kill('SIGKILL');
      await suite.serve.exited;
      output += suite.serve.output();
      suite.serve = undefined;
      stop = true;
      await Promise.all(clients);
    }
    // The last restart replays the last kill's journal; a graceful stop then drains everything.
    suite.serve = await startServe(suite.env, base);
    suite.serve.child.kill('SIGTERM');
    await suite.serve.exited;
    output += suite.serve.output();
    suite.serve = undefined;

    const served = new Set(upstream.requests.filter((r) => r.path.endsWith('/chat/completions')).map((r) => (r.json as { messages: { content: string }[] }).messages[0]!.content));
    const callOf = (metadata: string) => (JSON.parse(metadata) as { call?: string }).call!;
    // A kill between an admission's commit in the database (a cold wallet) and its journal entry
    // leaves a pending record the journal never held; its call never reached the provider (the
    // entry comes first). The sweep settles such records once their holds expire, as before the
    // journal; nothing else may be left pending.
    const pendingBeforeSweep = await storage.db.selectFrom('requests').select(['metadata']).where('merchant_id', '=', merchant.id).where('status', '=', 'pending').execute();
    const pendingServed = pendingBeforeSweep.map((r) => callOf(r.metadata)).filter((call) => served.has(call));
    const swept = await sweepExpiredHolds(storage, new Date(Date.now() + HOLD_TTL_MS + 1_000));
    const records = await storage.db
      .selectFrom('requests')
      .select(['id', 'status', 'metadata', 'total_wallet_cost', 'usage_estimated'])
      .where('merchant_id', '=', merchant.id)
      .execute();
    const recordsOf = new Map<string, typeof records>();
    for (const record of records) {
      const call = callOf(record.metadata);
      recordsOf.set(call, [...(recordsOf.get(call) ?? []), record]);
    }
    const charged = (call: string) => recordsOf.get(call)?.filter((r) => r.status === 'completed' && BigInt(r.total_wallet_cost) > 0n) ?? [];
    const missing = [...served].filter((call) => charged(call).length === 0);
    const recordedTwice = [...recordsOf].filter(([, rows]) => rows.length > 1).map(([call]) => call);
    const chargedTwice = await referencesChargedTwice(storage, merchant.id);
    const pending = records.filter((r) => r.status === 'pending').length;
    // Journalled, then killed before the provider had it: charged its estimate all the same (its
    // provider may have been called, as far as the restart can know).
    const chargedUnserved = [...recordsOf.keys()].filter((call) => !served.has(call) && charged(call).length > 0).length;
    const answeredByEstimate = [...answered].filter((call) => charged(call).some((r) => Number(r.usage_estimated) !== 0)).length;
    const total = records.filter((r) => r.status === 'completed').reduce((sum, r) => sum + BigInt(r.total_wallet_cost), 0n);
    const wallet = await storage.db.selectFrom('wallets').select(['balance']).where('id', '=', customer.wallet.wallet_id).executeTakeFirstOrThrow();
    const ledger = await verifyLedger(storage);
    printFigures(`served calls across SIGKILLs (${dialect})`, {
      kills: KILLS,
      calls_sent: sequence,
      served_by_provider: served.size,
      answered_200: answered.size,
      failed_at_kill: failedAtKill,
      records: records.length,
      missing_charge: missing.length,
      recorded_twice: recordedTwice.length,
      charged_twice: chargedTwice.length,
      pending_before_sweep: pendingBeforeSweep.length,
      swept,
      pending,
      charged_unserved: chargedUnserved,
      answered_charged_estimate: answeredByEstimate,
      ledger_problems: ledger.problems.length,
    });
    expect(output).not.toMatch(/sk_live_[A-Za-z0-9_-]{8,}|sk-managed-served-calls/);
    expect(served.size).toBeGreaterThan(KILLS * ANSWERS_PER_LIFE);
    expect(missing).toEqual([]);
    expect(recordedTwice).toEqual([]);
    expect(chargedTwice).toEqual([]);
    expect(pendingServed).toEqual([]);
    expect(pending).toBe(0);
    expect(ledger.problems).toEqual([]);
    expect(BigInt(wallet.balance)).toBe(GRANT - total);
  });
});
