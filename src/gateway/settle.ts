import type { FastifyBaseLogger } from 'fastify';
import { toSeconds, type Usage } from '../domain/pricing.ts';
import type { AppDeps } from '../app-deps.ts';
import { dateOf, type Clock } from '../domain/clock.ts';
import { FAIL_JOB, SETTLE_JOB, type SettleInput } from '../ledger/settlement/settle.ts';
import { lockRecoveryCounters, recoverPendingInTransaction, releaseUnsentAdmission } from '../ledger/settlement/recover.ts';
import { releaseDeferredHolds, takeOverAdmission, type AdmissionWrite } from '../ledger/admission/deferred.ts';
import { expireHolds } from '../ledger/holds.ts';
import type { Storage } from '../storage/db.ts';
import { estimateInputTokensFromRequest, estimateOutputTokensFromResponse, estimateTokensFromCharacters, isUsageBilledRequest } from '../providers/estimate.ts';
import type { StreamUsage, UsageReport } from '../providers/types.ts';
import type { ForwardPlan } from './forward-plan.ts';
import { PendingRecords, type PendingSource } from './pending-records.ts';
import type { ProviderContextSizes } from './provider-context.ts';
import type { RelayOutcome } from './relay.ts';
import { releaseOrphanedReservations } from '../ledger/spend-key-limits.ts';
import type { GroupCommitWriter } from '../ledger/group-commit.ts';
import type { CallJournal } from '../ledger/journal/journal.ts';
import { finishedLine } from '../ledger/journal/calls.ts';

/**
 * A settlement (or failure) that cannot be written is retried for about half a minute, so a
 * database outage of that length loses no outcome; past it the hold's TTL and the sweep take over.
 */
const RETRY_DELAYS_MS = [50, 500, 2000, 5000, 5000, 5000, 5000, 5000];

/**
 * Settles forwarded requests after their responses went out: the record becomes `completed` with
 * its usage and costs (or `error`, with the hold released and nothing charged). Tracks what is in
 * flight so a graceful shutdown waits for it; a settlement that keeps failing leaves its hold to
 * expire, which marks the record `error` rather than losing track of it.
 */
export class Settlements {
  readonly #inFlight = new Set<Promise<unknown>>();
  /** Forwarded requests relaying now (relayStarted, relayEnded), and drains waiting for none. */
  #relays = 0;
  readonly #relaysEnded: (() => void)[] = [];
  readonly #log: FastifyBaseLogger;
  readonly #writer: GroupCommitWriter;
  readonly #journal: CallJournal | null;

  readonly #contexts: ProviderContextSizes;
  /** Records of requests admitted here and not yet written, for GET /v1/requests/{id}. */
  readonly pending = new PendingRecords();

  constructor(log: FastifyBaseLogger, writer: GroupCommitWriter, contexts: ProviderContextSizes, journal: CallJournal | null = null) {
    this.#log = log;
    this.#writer = writer;
    this.#contexts = contexts;
    this.#journal = journal;
  }

  settle(deps: AppDeps, plan: ForwardPlan, outcome: RelayOutcome): void {
    const billed = billedUsage(plan, outcome, deps.clock.now());
    // The provider's own counts tell how large the context it keeps is; an estimate does not.
    if (billed?.usage && !billed.estimated) {
      const responseBody = outcome.kind === 'answered' ? outcome.responseBody : null;
      this.#contexts.learn(plan.contexts, { ...billed.usage, responseId: billed.usage.responseId ?? plan.target.provider.responseId(responseBody) });
    }
    // A charge whose admission is still queued takes it over: one record written, no hold rows.
    const merged = billed && takeOverAdmission(plan.deferred) ? plan.deferred : undefined;
    const { requestId, deferred } = plan;
    let write: SettlementWrite;
    const settledAt = dateOf(deps.clock);
    try {
      // Built now, so the request's and the answer's bodies are not kept while the settlement waits.
      write = settlementWrite(deps, plan, outcome, billed, merged, settledAt);
      this.#journalFinished(plan, write, settledAt);
    } catch (err) {
      this.#log.error({ err, requestId }, 'settlement failed; the hold will expire');
      if (merged) releaseDeferredHolds(merged);
      this.pending.delete(plan);
      return;
    }
    const work = (merged ? Promise.resolve(true) : this.#afterAdmissionWrite(deferred, requestId))
      .then((ready) => (ready ? this.#withRetries(() => write.run(this.#writer), requestId) : false))
      // Committed: the journal no longer needs the call. Otherwise it stays for the next start's replay.
      .then((committed) => committed && plan.journalled && this.#journal?.done(plan.journalled))
      .finally(() => {
        if (merged) releaseDeferredHolds(merged);
        // Written (or given up): from now on the database answers for the record.
        this.pending.delete(plan);
        this.#inFlight.delete(work);
      });
    this.#inFlight.add(work);
  }

  /**
   * What the relay ended with goes to the call journal before the settlement is queued: a crash
   * before it commits then settles the call with this usage, not its estimate (decision 0024).
   */
  #journalFinished(plan: ForwardPlan, write: SettlementWrite, at: Date): void {
    if (!plan.journalled || !this.#journal) return;
    const settled = write.settlement;
    const usage = settled && {
      usage: settled.usage,
      model: settled.model,
      requestedModel: settled.requestedModel,
      responseId: settled.responseId,
      usageEstimated: settled.usageEstimated,
      providerTimestamp: settled.providerTimestamp,
    };
    this.#journal.finished(plan.journalled, finishedLine({ id: plan.recordId, at: at.toISOString(), usage }));
  }

  /**
   * A call the journal could not take is not sent (a crash could lose it): it is failed as a call
   * that never reached its provider.
   */
  refuseUnjournalled(deps: AppDeps, plan: ForwardPlan, err: unknown, notSent: Extract<RelayOutcome, { kind: 'failed' }>): void {
    this.#log.error({ err, requestId: plan.requestId }, 'the call journal could not be written; the call is refused');
    this.settle(deps, plan, notSent);
  }

  /** False when a deferred admission could not be written: there is no record to settle then. */
  async #afterAdmissionWrite(deferred: AdmissionWrite | undefined, requestId: string): Promise<boolean> {
    if (!deferred) return true;
    try {
      await deferred.written;
      return true;
    } catch (err) {
      this.#log.error({ err, requestId }, 'the admission of a forwarded request could not be written; it is not recorded');
      return false;
    }
  }

  /**
   * An admission whose commit met a lost database connection may have committed: its request was
   * never sent, so once the database answers again its pending record (if any) is failed and its
   * holds released, rather than left for the sweep to charge (decision 0019).
   */
  releaseUnsent(storage: Storage, recordId: string, clock: Clock): void {
    const work = this.#withRetries(() => releaseUnsentAdmission(storage, recordId, dateOf(clock)), recordId).finally(() => this.#inFlight.delete(work));
    this.#inFlight.add(work);
  }

  /**
   * A forwarded request's relay began; relayEnded once its settlement is queued. A shutdown's drain
   * waits for it too, so a relay that ends during the shutdown (its connection closed when the
   * grace period was over) still queues its settlement before the writers are drained. A count,
   * so the request path adds no promise and no set entry.
   */
  relayStarted(plan: PendingSource): void {
    this.#relays++;
    this.pending.add(plan);
  }

  relayEnded(): void {
    if (--this.#relays === 0) for (const resolve of this.#relaysEnded.splice(0)) resolve();
  }

  /** Resolves when no relay is going and every settlement started so far has finished. */
  async drain(): Promise<void> {
    for (;;) {
      if (this.#relays > 0) await new Promise<void>((resolve) => this.#relaysEnded.push(resolve));
      else if (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
      else return;
    }
  }

  /** True once `run` succeeded; false when it kept failing. */
  async #withRetries(run: () => Promise<void>, requestId: string): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      try {
        await run();
        return true;
      } catch (err) {
        const delay = RETRY_DELAYS_MS[attempt];
        if (delay === undefined) {
          this.#log.error({ err, requestId }, 'settlement failed; the hold will expire');
          return false;
        }
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }
}

/** A settlement to write: its charge (`settlement`), or its failure when it is null. */
type SettlementWrite = { settlement: SettleInput | null; run: (writer: GroupCommitWriter) => Promise<void> };

/**
 * What the request's settlement writes, through the group-commit writer (settlements that finish
 * together share one transaction): its charge, or its failure when nothing is billed.
 */
function settlementWrite(
  deps: AppDeps,
  plan: ForwardPlan,
  outcome: RelayOutcome,
  billed: BilledUsage | null,
  merged: AdmissionWrite | undefined,
  now: Date,
): SettlementWrite {
  if (!billed) {
    const failure = { recordId: plan.recordId, holdIds: plan.holdIds, now };
    return { settlement: null, run: (writer) => writer.run(FAIL_JOB, failure) };
  }
  const { usage, estimated } = billed;
  const responseBody = outcome.kind === 'answered' ? outcome.responseBody : null;
  // The provider's name for what it served: from its answer, a stream's events included (the
  // meter noted it), else from the request. The request's own name is kept when it differs.
  const model = usage?.model ?? plan.target.provider.modelFrom(plan.requestJson, plan.target.publicUrl, responseBody) ?? plan.model;
  const settlement: SettleInput = {
    recordId: plan.recordId,
    holdIds: plan.holdIds,
    billing: plan.billing,
    usage: toUsage(usage),
    model,
    requestedModel: plan.model !== null && plan.model !== model ? plan.model : null,
    prices: plan.prices,
    baseCostCharged: plan.providerKeyType === 'managed' && plan.prices !== null,
    serviceChargeRate: plan.billing.serviceChargeRate ?? deps.config.serviceChargeRate,
    responseId: usage?.responseId ?? plan.target.provider.responseId(responseBody),
    usageEstimated: estimated,
    providerTimestamp: usage?.completedAt ?? null,
    record: {
      provider: plan.target.provider.id,
      endpoint: plan.endpoint,
      provider_key_type: plan.providerKeyType,
      metadata: plan.metadata,
      created_at: plan.admittedAt,
    },
    merged,
    now,
  };
  return {
    settlement,
    run: async (writer) => {
      await writer.run(SETTLE_JOB, settlement);
    },
  };
}

function isEstimated(usage: UsageReport | StreamUsage | null): boolean {
  return usage !== null && 'estimated' in usage && usage.estimated;
}

type BilledUsage = { usage: UsageReport | null; estimated: boolean };

/**
 * What a forwarded request is charged for; null when it is charged nothing: the provider refused
 * it, could not be reached, or never had it (the client left before it was sent). Whenever the
 * provider may have done billable work without reporting its usage — the client left before the
 * answer, the answer's body was cut, a generation answer carried no usage — the usage is
 * estimated from what was seen (see providers/estimate.ts) and flagged: never free.
 */
function billedUsage(plan: ForwardPlan, outcome: RelayOutcome, now: number): BilledUsage | null {
  if (outcome.kind === 'failed') return null;
  if (outcome.kind === 'abandoned') {
    // Nothing of the answer was seen: the prompt is billed, output the provider may have made is not known.
    const usage = outcome.requestSent ? estimatedUsage(plan, 0, now) : null;
    return usage ? { usage, estimated: true } : null;
  }
  if (outcome.status >= 400) return null;
  if (outcome.usage) return { usage: outcome.usage, estimated: isEstimated(outcome.usage) };
  const outputTokens = outcome.cutBody
    ? estimateTokensFromCharacters(outcome.cutBody.characters)
    : estimateOutputTokensFromResponse(outcome.responseBody);
  const usage = estimatedUsage(plan, outputTokens, now);
  return usage ? { usage, estimated: true } : { usage: null, estimated: false };
}

/** Usage known from the request (speech characters), else tokens estimated for a usage-billed endpoint. */
function estimatedUsage(plan: ForwardPlan, outputTokens: number, now: number): UsageReport | null {
  const fromRequest = plan.target.provider.usageFromRequest({ url: plan.target.publicUrl, requestBody: plan.requestJson, now });
  if (fromRequest) return fromRequest;
  if (!isUsageBilledRequest(plan.method, plan.target.publicUrl)) return null;
  return {
    inputTokens: estimateInputTokensFromRequest(plan.requestJson),
    outputTokens,
    inputCharacters: 0,
    outputCharacters: 0,
    inputSeconds: 0,
    outputSeconds: 0,
  };
}

function toUsage(report: UsageReport | null): Usage {
  const inputTokens = report?.inputTokens ?? 0;
  // Cache counts are parts of the input; a provider reporting more than the whole must not make
  // the settlement throw (and so go uncharged): the parts are capped at the input total.
  const cachedInputTokens = Math.min(report?.cachedInputTokens ?? 0, inputTokens);
  const cacheWriteInputTokens = Math.min(report?.cacheWriteInputTokens ?? 0, inputTokens - cachedInputTokens);
  const audioInputTokens = Math.min(report?.audioInputTokens ?? 0, inputTokens - cachedInputTokens - cacheWriteInputTokens);
  const outputTokens = report?.outputTokens ?? 0;
  return {
    inputTokens,
    outputTokens,
    // A part of the output, shown apart: capped at the output like the cache counts at the input.
    reasoningTokens: Math.min(report?.reasoningTokens ?? 0, outputTokens),
    outputImages: report?.outputImages ?? 0,
    inputCharacters: report?.inputCharacters ?? 0,
    outputCharacters: report?.outputCharacters ?? 0,
    inputSeconds: toSeconds(report?.inputSeconds ?? 0),
    outputSeconds: toSeconds(report?.outputSeconds ?? 0),
    cachedInputTokens,
    cacheWriteInputTokens,
    audioInputTokens,
  };
}

/**
 * Releases holds past their TTL (a crashed or stuck settlement) and recovers their requests in the
 * same transaction per batch: a pending record is charged the estimate its hold was placed for,
 * flagged `usage_estimated`, since its provider call may have been answered (decision 0019); one
 * without an estimate is marked `error`. Returns how many requests it swept.
 */
export async function sweepExpiredHolds(storage: Storage, now: Date, batchSize?: number): Promise<number> {
  const references = await expireHolds(storage, now, {
    batchSize,
    lockFirst: (trx, recordIds) => lockRecoveryCounters(trx, storage.dialect, recordIds, now.toISOString()),
    inSameTransaction: (trx, recordIds) => recoverPendingInTransaction(trx, storage.dialect, recordIds, now.toISOString()),
  });
  await releaseOrphanedReservations(storage, now);
  return references.length;
}
