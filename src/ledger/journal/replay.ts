/**
 * Replay of a call journal left by a process that did not stop gracefully (decision 0024), before
 * the next one serves. Every journalled call whose record is not settled in the database is
 * brought there: its admission is written if it never was (pending record and holds, as the
 * deferred write would have), then it is settled with the usage its relay ended with, failed when
 * nothing was billed, or charged its estimate when its relay had not ended.
 *
 * Idempotent: a call whose record is already settled (its settlement committed before the kill,
 * or an earlier replay got that far) is left alone, and each step is one transaction that checks
 * the record is still pending, so a replay cut short is simply run again.
 */
import type { Storage } from '../../storage/db.ts';
import { holdPartsOf, pendingRecord, type AdmitInput } from '../admission/admit.ts';
import { holdRowsOf } from '../holds.ts';
import { writeAdmissionRows } from '../admission/rows.ts';
import { recoverUnsettled } from '../settlement/recover.ts';
import { failRequest, settleRequest } from '../settlement/settle.ts';
import { callsOf, type AdmittedCall, type FinishedCall } from './calls.ts';
import { readSegmentLines } from './journal.ts';

export type ReplaySummary = {
  /** Calls the journal holds an admission of. */
  calls: number;
  /** Already settled in the database: nothing done. */
  alreadySettled: number;
  /** Admissions written by the replay (their records were not in the database). */
  admissionsWritten: number;
  /** Settled with the usage their relay ended with. */
  settled: number;
  /** Recorded as failed: their relay ended with nothing billed. */
  failed: number;
  /** Charged their estimate: their relay had not ended. */
  chargedEstimate: number;
};

/** How many record ids one status lookup asks for. */
const LOOKUP_CHUNK = 500;

/** Replays the journal segments at `paths` into the database; `now` is the app clock's time. */
export async function replayCallJournal(storage: Storage, paths: readonly string[], now: Date): Promise<ReplaySummary> {
  const calls = [...callsOf(readSegmentLines(paths)).values()].flatMap((call) => (call.admitted ? [{ admitted: call.admitted, finished: call.finished }] : []));
  const summary: ReplaySummary = { calls: calls.length, alreadySettled: 0, admissionsWritten: 0, settled: 0, failed: 0, chargedEstimate: 0 };
  const statuses = await recordStatuses(storage, calls.map((call) => call.admitted.id));
  for (const { admitted, finished } of calls) {
    const status = statuses.get(admitted.id);
    if (status !== undefined && status !== 'pending') {
      summary.alreadySettled++;
      continue;
    }
    const written = status === undefined ? await writeAdmission(storage, admitted) : null;
    if (written) summary.admissionsWritten++;
    if (!finished) {
      // The recovery finds and releases the record's active holds itself.
      summary.chargedEstimate += await recoverUnsettled(storage, [admitted.id], now.toISOString());
      continue;
    }
    const holdIds = written ?? (await activeHoldIds(storage, admitted.id));
    if (finished.usage) {
      const outcome = await settleRequest(storage, settleInputOf(admitted, finished, holdIds));
      if (outcome.outcome === 'recorded') summary.settled++;
    } else {
      await failRequest(storage, { recordId: admitted.id, holdIds, now: new Date(finished.at) });
      summary.failed++;
    }
  }
  return summary;
}

async function recordStatuses(storage: Storage, ids: string[]): Promise<Map<string, string>> {
  const statuses = new Map<string, string>();
  for (let i = 0; i < ids.length; i += LOOKUP_CHUNK) {
    const rows = await storage.db.selectFrom('requests').select(['id', 'status']).where('id', 'in', ids.slice(i, i + LOOKUP_CHUNK)).execute();
    for (const row of rows) statuses.set(row.id, row.status);
  }
  return statuses;
}

function admitInputOf(call: AdmittedCall): AdmitInput {
  return {
    requestId: call.id,
    billing: call.billing,
    walletId: call.walletId,
    estimate: call.estimate,
    ttlMs: call.ttlMs,
    record: call.record,
    now: new Date(call.admittedAt),
  };
}

/**
 * The admission as its deferred write would have left it: pending record and holds raising `held`.
 * A hold taken from a lease is held anew: the dead instance's lease still holds that share until
 * the lease expires and is released, so `held` covers it twice for those seconds, never less.
 */
async function writeAdmission(storage: Storage, call: AdmittedCall): Promise<string[]> {
  const input = admitInputOf(call);
  const holds = holdRowsOf(holdPartsOf(input), call.id, input.now, call.ttlMs);
  await storage.db.transaction().execute((trx) => writeAdmissionRows(trx, holds, [pendingRecord(input, call.id, call.admittedAt)]));
  return holds.map((hold) => hold.id);
}

async function activeHoldIds(storage: Storage, recordId: string): Promise<string[]> {
  const rows = await storage.db.selectFrom('holds').select('id').where('reference', '=', recordId).where('status', '=', 'active').execute();
  return rows.map((row) => row.id);
}

function settleInputOf(admitted: AdmittedCall, finished: FinishedCall, holdIds: string[]) {
  const usage = finished.usage!;
  return {
    recordId: admitted.id,
    holdIds,
    billing: admitted.billing,
    usage: usage.usage,
    model: usage.model,
    requestedModel: usage.requestedModel ?? null,
    prices: admitted.prices,
    baseCostCharged: admitted.baseCostCharged,
    serviceChargeRate: admitted.serviceChargeRate,
    responseId: usage.responseId,
    usageEstimated: usage.usageEstimated,
    providerTimestamp: usage.providerTimestamp ?? null,
    now: new Date(finished.at),
  };
}
