import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { forwardToken } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startReceiver } from '../helpers/webhook-receiver.ts';
import { printFigures, referencesChargedTwice, startServe, useServeSuite } from './harness.ts';
import { until } from '../helpers/until.ts';

/**
 * Graceful stop under load: a real `tollgate serve` process gets SIGTERM while clients record
 * usage, forward calls, stream short answers, and hold two streams that would go on for a minute
 * (one read, one no longer read). It exits by itself within SHUTDOWN_GRACE_MS and a margin, and
 * leaves nothing for the sweep: no record pending, no hold active, every forward answered 200
 * charged once (the two long streams cut at the deadline and charged for what was relayed), every
 * short stream in flight at the signal relayed whole, every 201 recorded once, the wallet equal to
 * its grant minus its charges, the ledger verified. Run on both engines (SQLite's admissions are
 * written after the answer; PostgreSQL's hot wallet is admitted from leases). A second test stops a
 * server with a webhook send and a stream in flight, each held to a deadline of the same length:
 * background work and requests stop together, so the stop takes one deadline, not two, and the
 * send's timed-out attempt is on record (waited for, not abandoned).
 */

const GRACE_MS = 3_000;
/** Beyond the grace: the drain, the writers and the storage closing on a loaded machine. */
const EXIT_MARGIN_MS = 10_000;
const FAST_CLIENTS = 6;
const STREAM_CLIENTS = 3;
const SHORT_STREAM_WORDS = 30;
/** 5,000 words 10 ms apart: close to a minute of stream, far beyond the grace. */
const LONG_STREAM_WORDS = 5_000;
const CHUNK_DELAY_MS = 10;
const OPENAI = 'https://api.openai.com/v1';
const GRANT = parseMoney('1000');
/**
 * The second test's two deadlines: a stream's grace and a webhook send's timeout, each longer than
 * the margin it allows for the drain, so a stop that waited for one after the other could not pass.
 */
const OVERLAP_DEADLINE_MS = 5_000;
const OVERLAP_MARGIN_MS = 3_500;

describe.each(databasesUnderTest())('graceful stop: SIGTERM mid-load on %s', (dialect) => {
  const suite = useServeSuite(dialect, 'sk-managed-graceful-suite', { SHUTDOWN_GRACE_MS: String(GRACE_MS) });

  it('exits within the grace period and leaves every request settled, none for the sweep', async () => {
    const { storage, upstream, env, base } = suite;
    // Streams are the Responses API's, each word CHUNK_DELAY_MS apart; chat completions answer at once.
    upstream.setNext({ path: '/responses', chunkDelayMs: CHUNK_DELAY_MS, times: Infinity });
    const { merchant, secretKey } = await createMerchant(storage, { name: 'Graceful' }, new Date().toISOString());
    const serve = (suite.serve = await startServe(env, base));
    const auth = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
    const json = async (path: string, body: unknown) => (await fetch(`${base}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) })).json();
    const customer = await json('/v1/customers', { name: 'Graceful customer' });
    const meter = await json('/v1/meters', { name: 'm', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '100' }] });
    await creditWallet(storage, customer.wallet.wallet_id, GRANT, new Date().toISOString());
    const token = forwardToken(secretKey, customer.customer_id, meter.meter_slug);
    const forwardHeaders = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
    const forwardTo = (endpoint: string, body: unknown) =>
      fetch(`${base}/v1/forward?u=${encodeURIComponent(`${OPENAI}${endpoint}`)}`, { method: 'POST', headers: forwardHeaders, body: JSON.stringify(body) });
    const streamOf = (words: number) => forwardTo('/responses', { model: 'gpt-4o-mini', input: 'tell a story', stream: true, max_output_tokens: words });

    const recorded = new Set<string>();
    const forwarded = new Set<string>();
    const figures = { recorded_201: 0, forwards_200: 0, streams_whole: 0, streams_cut: 0, refused_503: 0, refused_at_socket: 0, other: 0 };
    let sequence = 0;
    /** Counts one answer; the ids of 2xx answers are kept to be found in the database. */
    const tally = (res: Response) => {
      if (res.status === 503) figures.refused_503++;
      else if (res.status !== 200 && res.status !== 201) figures.other++;
      else if (res.status === 200) forwarded.add(res.headers.get('x-tollgate-request-id')!);
    };
    // A client goes on until the stopping server refuses it (503, or its port closed), as one that
    // would then retry elsewhere.
    const refused = (res: Response) => res.status === 503;

    const fastClient = async () => {
      for (;;) {
        const n = sequence++;
        try {
          if (n % 2 === 0) {
            const requestId = `graceful-${n}`;
            const res = await fetch(`${base}/v1/requests`, { method: 'POST', headers: auth, body: JSON.stringify({ request_id: requestId, customer_id: customer.customer_id, meter_slug: meter.meter_slug, input_tokens: 10, output_tokens: 5 }) });
            await res.arrayBuffer();
            if (res.status === 201) {
              recorded.add(requestId);
              figures.recorded_201++;
            } else tally(res);
            if (refused(res)) return;
          } else {
            const res = await forwardTo('/chat/completions', { model: 'gpt-4o-mini', messages: [{ role: 'user', content: `n ${n}` }], max_tokens: 5 });
            await res.arrayBuffer();
            tally(res);
            if (res.status === 200) figures.forwards_200++;
            if (refused(res)) return;
          }
        } catch {
          figures.refused_at_socket++;
          return;
        }
      }
    };
    const streamClient = async () => {
      for (;;) {
        try {
          const res = await streamOf(SHORT_STREAM_WORDS);
          const text = await res.text();
          tally(res);
          if (refused(res)) return;
          if (res.status !== 200) continue;
          if (text.includes('response.completed')) figures.streams_whole++;
          else figures.streams_cut++;
        } catch {
          figures.refused_at_socket++;
          return;
        }
      }
    };
    /** A stream far longer than the grace: `reading` reads it to its end, else only its first chunk. */
    const longStream = async (reading: boolean) => {
      const res = await streamOf(LONG_STREAM_WORDS);
      tally(res);
      const reader = res.body!.getReader();
      let text = new TextDecoder().decode((await reader.read()).value);
      if (!reading) return { requestId: res.headers.get('x-tollgate-request-id')!, text: async () => text, cancel: () => reader.cancel().catch(() => {}) };
      const rest = (async () => {
        try {
          for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += new TextDecoder().decode(chunk.value);
        } catch {
          // The connection was closed at the deadline.
        }
        return text;
      })();
      return { requestId: res.headers.get('x-tollgate-request-id')!, text: () => rest, cancel: async () => {} };
    };

    const clients = [...Array.from({ length: FAST_CLIENTS }, fastClient), ...Array.from({ length: STREAM_CLIENTS }, streamClient)];
    const longs = [await longStream(true), await longStream(false)];
    await until(() => figures.recorded_201 + figures.forwards_200 + figures.streams_whole >= 200, '200 answers before the signal', { timeoutMs: 60_000 });

    const signalledAt = performance.now();
    serve.child.kill('SIGTERM');
    const exitCode = await serve.exited;
    const stoppedAfterMs = Math.round(performance.now() - signalledAt);
    const output = serve.output();
    suite.serve = undefined;
    await Promise.all(clients);
    const longTexts = await Promise.all(longs.map((l) => l.text()));
    await Promise.all(longs.map((l) => l.cancel()));

    const records = await storage.db
      .selectFrom('requests')
      .select(['id', 'request_id', 'status', 'total_wallet_cost', 'connection_id', 'usage_estimated'])
      .where('merchant_id', '=', merchant.id)
      .execute();
    const byId = new Map(records.map((r) => [r.id, r]));
    const perRequestId = new Map<string, number>();
    for (const r of records) perRequestId.set(r.request_id, (perRequestId.get(r.request_id) ?? 0) + 1);
    const missingFor201 = [...recorded].filter((id) => perRequestId.get(id) !== 1).length;
    const forwardsNotCharged = [...forwarded].filter((id) => byId.get(id)?.status !== 'completed').length;
    const pending = records.filter((r) => r.status === 'pending').length;
    const activeHolds = await storage.db.selectFrom('holds').select('id').where('status', '=', 'active').execute();
    const chargedTwice = await referencesChargedTwice(storage, merchant.id);
    const charged = records.filter((r) => r.status === 'completed' && r.connection_id === customer.customer_id).reduce((s, r) => s + BigInt(r.total_wallet_cost), 0n);
    const wallet = await storage.db.selectFrom('wallets').select(['balance', 'held']).where('id', '=', customer.wallet.wallet_id).executeTakeFirstOrThrow();
    const balanceMatches = BigInt(wallet.balance) === GRANT - charged;
    const longRecords = longs.map((l) => byId.get(l.requestId));
    const longsCutAndCharged = longRecords.filter((r) => r?.status === 'completed' && Number(r.usage_estimated) === 1 && BigInt(r.total_wallet_cost) > 0n).length;
    const ledger = await verifyLedger(storage);
    const discrepancies =
      missingFor201 + forwardsNotCharged + pending + activeHolds.length + chargedTwice.length + (balanceMatches ? 0 : 1) + figures.streams_cut + figures.other + (longs.length - longsCutAndCharged) + ledger.problems.length;
    printFigures(`graceful stop (${dialect})`, {
      ...figures,
      grace_ms: GRACE_MS,
      stopped_after_ms: stoppedAfterMs,
      exit_code: exitCode ?? 'signal',
      records: records.length,
      missing_for_201: missingFor201,
      forwards_not_charged: forwardsNotCharged,
      long_streams_cut_and_charged: longsCutAndCharged,
      pending_after_stop: pending,
      active_holds_after_stop: activeHolds.length,
      charged_twice: chargedTwice.length,
      ledger_problems: ledger.problems.length,
      discrepancies,
    });
    expect(exitCode, output.slice(-2000)).toBe(0);
    expect(stoppedAfterMs).toBeGreaterThanOrEqual(GRACE_MS);
    expect(stoppedAfterMs).toBeLessThan(GRACE_MS + EXIT_MARGIN_MS);
    expect(longTexts.every((text) => !text.includes('response.completed'))).toBe(true);
    expect(longsCutAndCharged).toBe(longs.length);
    expect(figures.streams_whole).toBeGreaterThan(0);
    expect(figures.streams_cut).toBe(0);
    expect(figures.other).toBe(0);
    expect(missingFor201).toBe(0);
    expect(forwardsNotCharged).toBe(0);
    expect(pending).toBe(0);
    expect(activeHolds).toEqual([]);
    expect(BigInt(wallet.held)).toBe(0n);
    expect(chargedTwice).toEqual([]);
    expect(balanceMatches).toBe(true);
    expect(ledger.problems).toEqual([]);
    expect(output).not.toMatch(/sk_live_[A-Za-z0-9_-]{8,}|sk-managed-graceful-suite/);
  });

  it('waits for a webhook send and a stream in flight together: the longer deadline, not their sum', async () => {
    const { storage, upstream, env, base } = suite;
    upstream.setNext({ path: '/responses', chunkDelayMs: CHUNK_DELAY_MS, times: Infinity });
    // A receiver that takes the delivery and never answers: the send ends at the webhook timeout.
    const hanging: { destroy(): void }[] = [];
    const receiver = await startReceiver((_req, res) => {
      hanging.push(res);
      return 'handled';
    });
    const serve = (suite.serve = await startServe(
      { ...env, SHUTDOWN_GRACE_MS: String(OVERLAP_DEADLINE_MS), WEBHOOK_TIMEOUT_MS: String(OVERLAP_DEADLINE_MS), WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' },
      base,
    ));
    try {
      const { merchant, secretKey } = await createMerchant(storage, { name: 'Overlapping deadlines' }, new Date().toISOString());
      const auth = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
      const post = async (path: string, body: unknown) => (await fetch(`${base}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) })).json();
      await post('/v1/webhooks', { name: 'hangs', url: receiver.url, events: ['customer.created'] });
      const customer = await post('/v1/customers', { name: 'Overlap customer' });
      const meter = await post('/v1/meters', { name: 'm', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '100' }] });
      await creditWallet(storage, customer.wallet.wallet_id, GRANT, new Date().toISOString());
      await receiver.waitFor(1, 10_000);
      const token = forwardToken(secretKey, customer.customer_id, meter.meter_slug);
      const stream = await fetch(`${base}/v1/forward?u=${encodeURIComponent(`${OPENAI}/responses`)}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o-mini', input: 'tell a story', stream: true, max_output_tokens: LONG_STREAM_WORDS }),
      });
      expect(stream.status).toBe(200);
      const streamed = stream.text().catch(() => 'cut');

      const signalledAt = performance.now();
      serve.child.kill('SIGTERM');
      const exitCode = await serve.exited;
      const stoppedAfterMs = Math.round(performance.now() - signalledAt);
      suite.serve = undefined;
      await streamed;
      // The send was waited for, not abandoned: its timed-out attempt is on record.
      const deliveries = await storage.db
        .selectFrom('webhook_deliveries')
        .innerJoin('webhooks', 'webhooks.id', 'webhook_deliveries.webhook_id')
        .select(['webhook_deliveries.attempts', 'webhook_deliveries.last_error', 'webhook_deliveries.state'])
        .where('webhooks.merchant_id', '=', merchant.id)
        .execute();
      printFigures(`overlapping deadlines (${dialect})`, {
        grace_ms: OVERLAP_DEADLINE_MS,
        webhook_timeout_ms: OVERLAP_DEADLINE_MS,
        stopped_after_ms: stoppedAfterMs,
        exit_code: exitCode ?? 'signal',
        deliveries_received: receiver.received.length,
        delivery_attempts_recorded: deliveries.reduce((sum, d) => sum + Number(d.attempts), 0),
      });
      expect(exitCode, serve.output().slice(-2000)).toBe(0);
      // The stream held the stop for its whole grace; one deadline after the other would take twice that.
      expect(stoppedAfterMs).toBeGreaterThanOrEqual(OVERLAP_DEADLINE_MS);
      expect(stoppedAfterMs).toBeLessThan(OVERLAP_DEADLINE_MS + OVERLAP_MARGIN_MS);
      expect(deliveries.map((d) => ({ attempts: Number(d.attempts), lastError: d.last_error, state: d.state }))).toEqual([
        { attempts: 1, lastError: 'timeout', state: 'pending' },
      ]);
    } finally {
      for (const res of hanging) res.destroy();
      await receiver.close();
    }
  });
});
