import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/ids.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { admittedLine, finishedLine, type AdmittedCall, type FinishedCall } from '../../src/ledger/journal/calls.ts';
import { replayCallJournal } from '../../src/ledger/journal/replay.ts';
import { failRequest, settleRequest } from '../../src/ledger/settlement/settle.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { databasesUnderTest, runTempDir } from '../helpers/databases.ts';
import { forwardToken, startTestApp, type CustomerWithMeter, type TestApp } from '../helpers/app.ts';
import { referencesChargedTwice } from '../reliability/harness.ts';

/**
 * Replay of a call journal left by a killed process (decision 0024), against a real database: every
 * journalled call whose settlement never committed is recorded and charged once — its final usage
 * when its relay had ended, else its estimate — and a replay run again charges nothing more.
 */
describe.each(databasesUnderTest())('call journal replay (%s)', (dialect) => {
  let t: TestApp;
  let customer: CustomerWithMeter;
  const GRANT = parseMoney('100');
  const PER_REQUEST = parseMoney('0.25');

  beforeAll(async () => {
    t = await startTestApp(dialect);
    customer = await t.customerWithMeter({ credit: '100' });
  });
  afterAll(async () => t?.close());

  /** A call as the gateway would have admitted it: the fixed meter's 0.25 held on the customer's wallet. */
  async function admittedCall(payer = customer): Promise<AdmittedCall> {
    const billing = await resolveForwardCredential(t.storage, forwardToken(t.merchant.secretKey, payer.customerId, payer.meterSlug), new Date());
    const requestBody = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 };
    const estimate = estimateHold({ requestBody, pricing: pricingFor(billing).pricing, prices: null, baseCostCharged: false, serviceChargeRate: 0n });
    return {
      id: newId('request'),
      admittedAt: new Date().toISOString(),
      ttlMs: 60_000,
      walletId: payer.walletId,
      estimate,
      record: { provider: 'openai', model: 'gpt-4o-mini', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed', metadata: { run: 'replay' } },
      billing,
      prices: null,
      baseCostCharged: false,
      serviceChargeRate: 0n,
    };
  }

  const finished = (call: AdmittedCall, billed: boolean): FinishedCall => ({
    id: call.id,
    at: new Date().toISOString(),
    usage: billed
      ? {
          usage: { inputTokens: 11, outputTokens: 7, inputCharacters: 0, outputCharacters: 0, inputSeconds: '0', outputSeconds: '0' },
          model: 'gpt-4o-mini-2024-07-18',
          requestedModel: 'gpt-4o-mini',
          responseId: 'chatcmpl-replayed',
          usageEstimated: false,
          providerTimestamp: null,
        }
      : null,
  });

  function journalFile(lines: string[]): string {
    const path = join(runTempDir(), 'left.calls');
    writeFileSync(path, lines.join('\n') + '\n');
    return path;
  }

  const record = (id: string) => t.storage.db.selectFrom('requests').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  const wallet = () => t.storage.db.selectFrom('wallets').select(['balance', 'held']).where('id', '=', customer.walletId).executeTakeFirstOrThrow();

  it('records and charges once every call a killed process left unsettled, by its final usage, its estimate or as failed', async () => {
    const served = await admittedCall();
    const inFlight = await admittedCall();
    const refused = await admittedCall();
    // Admitted in the database before its provider was called (a cold wallet, or a deferred write that made it).
    const written = await admittedCall();
    const admitted = await admitRequest(t.storage, { requestId: written.id, billing: written.billing, walletId: written.walletId, estimate: written.estimate, ttlMs: 60_000, record: written.record, now: new Date(written.admittedAt) });
    expect(admitted.outcome).toBe('admitted');
    // The last line is cut short, as a power loss may leave it.
    const lines = [
      admittedLine(served),
      admittedLine(inFlight),
      admittedLine(refused),
      admittedLine(written),
      finishedLine(finished(served, true)),
      finishedLine(finished(refused, false)),
      finishedLine(finished(written, true)),
      finishedLine(finished(inFlight, true)).slice(0, 40),
    ];
    const path = journalFile(lines);

    const summary = await replayCallJournal(t.storage, [path], new Date());
    expect(summary).toEqual({ calls: 4, alreadySettled: 0, admissionsWritten: 3, settled: 2, failed: 1, chargedEstimate: 1 });

    const servedRecord = await record(served.id);
    expect(Number(servedRecord.usage_estimated)).toBe(0);
    expect(servedRecord).toMatchObject({ status: 'completed', input_tokens: 11n, output_tokens: 7n, model: 'gpt-4o-mini-2024-07-18', response_id: 'chatcmpl-replayed' });
    expect(BigInt(servedRecord.total_wallet_cost)).toBe(PER_REQUEST);
    const writtenRecord = await record(written.id);
    expect(writtenRecord).toMatchObject({ status: 'completed', input_tokens: 11n });
    expect(Number(writtenRecord.usage_estimated)).toBe(0);
    const inFlightRecord = await record(inFlight.id);
    expect(inFlightRecord.status).toBe('completed');
    expect(Number(inFlightRecord.usage_estimated)).toBe(1);
    expect(BigInt(inFlightRecord.total_wallet_cost)).toBe(BigInt(inFlight.estimate.charge!.total_wallet_cost));
    expect((await record(refused.id)).status).toBe('error');

    const charged = PER_REQUEST * 2n + BigInt(inFlight.estimate.charge!.total_wallet_cost);
    expect(await wallet()).toMatchObject({ balance: GRANT - charged, held: 0n });
    expect((await verifyLedger(t.storage)).problems).toEqual([]);

    // Run again (a replay cut short, or a start that failed after it): nothing is charged twice.
    const again = await replayCallJournal(t.storage, [path], new Date());
    expect(again).toMatchObject({ calls: 4, alreadySettled: 4, admissionsWritten: 0, settled: 0, failed: 0, chargedEstimate: 0 });
    expect(await wallet()).toMatchObject({ balance: GRANT - charged, held: 0n });
    expect(await referencesChargedTwice(t.storage, t.merchant.merchantId)).toEqual([]);
  });

  it('leaves alone a call whose settlement committed before the kill, and one whose admission line alone is missing', async () => {
    const before = await wallet();
    const call = await admittedCall();
    const first = journalFile([admittedLine(call), finishedLine(finished(call, true))]);
    await replayCallJournal(t.storage, [first], new Date());
    const afterFirst = await wallet();
    expect(BigInt(afterFirst.balance)).toBe(BigInt(before.balance) - PER_REQUEST);
    // Its admission's segment was deleted (the call was done); only its outcome line is left.
    const orphan = journalFile([finishedLine(finished(call, true))]);
    expect(await replayCallJournal(t.storage, [orphan], new Date())).toMatchObject({ calls: 0 });
    expect(await wallet()).toEqual(afterFirst);
  });

  it('charges each journalled call once, whatever the kill left of it and however often the replay runs', async () => {
    const callState = fc.record({
      // Whether its admission reached the database before the kill (a cold wallet, a deferred write past 50 ms).
      admissionWritten: fc.boolean(),
      // What its relay ended with, if it ended.
      finished: fc.constantFrom('billed', 'failed', 'none'),
      // Whether its settlement committed before the kill (only after its relay ended).
      settled: fc.boolean(),
    });
    await fc.assert(
      fc.asyncProperty(fc.array(callState, { minLength: 1, maxLength: 4 }), fc.integer({ min: 1, max: 2 }), async (states, replays) => {
        const payer = await t.customerWithMeter({ credit: '100' });
        const lines: string[] = [];
        const expected: { id: string; status: string; cost: bigint; estimated: boolean }[] = [];
        for (const state of states) {
          const call = await admittedCall(payer);
          const end = state.finished === 'none' ? undefined : finished(call, state.finished === 'billed');
          lines.push(admittedLine(call));
          if (end) lines.push(finishedLine(end));
          const settled = state.settled && end !== undefined;
          if (state.admissionWritten || settled) {
            const admitted = await admitRequest(t.storage, { requestId: call.id, billing: call.billing, walletId: call.walletId, estimate: call.estimate, ttlMs: 60_000, record: call.record, now: new Date(call.admittedAt) });
            if (admitted.outcome !== 'admitted') throw new Error(admitted.outcome);
            if (settled && end.usage) {
              const u = end.usage;
              await settleRequest(t.storage, { now: new Date(), recordId: call.id, holdIds: admitted.holdIds, billing: call.billing, usage: u.usage, model: u.model, requestedModel: u.requestedModel ?? null, prices: null, baseCostCharged: false, serviceChargeRate: 0n, responseId: u.responseId, usageEstimated: false });
            } else if (settled) await failRequest(t.storage, { now: new Date(), recordId: call.id, holdIds: admitted.holdIds });
          }
          if (state.finished === 'billed') expected.push({ id: call.id, status: 'completed', cost: PER_REQUEST, estimated: false });
          else if (state.finished === 'failed') expected.push({ id: call.id, status: 'error', cost: 0n, estimated: false });
          else expected.push({ id: call.id, status: 'completed', cost: BigInt(call.estimate.charge!.total_wallet_cost), estimated: true });
        }
        const path = journalFile(lines);
        for (let i = 0; i < replays; i++) await replayCallJournal(t.storage, [path], new Date());

        const rows = await t.storage.db.selectFrom('requests').select(['id', 'status', 'total_wallet_cost', 'usage_estimated']).where('connection_id', '=', payer.customerId).execute();
        expect(rows).toHaveLength(expected.length);
        for (const want of expected) {
          const row = rows.find((r) => r.id === want.id)!;
          expect({ status: row.status, cost: BigInt(row.total_wallet_cost), estimated: Number(row.usage_estimated) === 1 }).toEqual({ status: want.status, cost: want.cost, estimated: want.estimated });
        }
        const charged = expected.reduce((sum, want) => sum + want.cost, 0n);
        const payerWallet = await t.storage.db.selectFrom('wallets').select(['balance', 'held']).where('id', '=', payer.walletId).executeTakeFirstOrThrow();
        expect(payerWallet).toMatchObject({ balance: GRANT - charged, held: 0n });
      }),
      { numRuns: 12 },
    );
    expect(await referencesChargedTwice(t.storage, t.merchant.merchantId)).toEqual([]);
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
