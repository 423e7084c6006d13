import type { FastifyBaseLogger } from 'fastify';
import { toSeconds, type Usage } from '../domain/pricing.ts';
import type { AppDeps } from '../http/types.ts';
import { FAIL_JOB, failRequest, SETTLE_JOB } from '../ledger/forwarded.ts';
import { expireHolds } from '../ledger/holds.ts';
import type { Storage } from '../storage/db.ts';
import type { StreamUsage, UsageReport } from '../providers/types.ts';
import type { ForwardPlan } from './forward.ts';
import type { RelayOutcome } from './relay.ts';
import type { GatewayWriter } from './writer.ts';

const RETRY_DELAYS_MS = [50, 500, 2000];

/**
 * Settles forwarded requests after their responses went out: the record becomes `completed` with
 * its usage and costs (or `error`, with the hold released and nothing charged). Tracks what is in
 * flight so a graceful shutdown waits for it; a settlement that keeps failing leaves its hold to
 * expire, which marks the record `error` rather than losing track of it.
 */
export class Settlements {
  readonly #inFlight = new Set<Promise<void>>();
  readonly #log: FastifyBaseLogger;
  readonly #writer: GatewayWriter;

  constructor(log: FastifyBaseLogger, writer: GatewayWriter) {
    this.#log = log;
    this.#writer = writer;
  }

  settle(deps: AppDeps, plan: ForwardPlan, outcome: RelayOutcome): void {
    const work = this.#withRetries(() => settleOnce(deps, this.#writer, plan, outcome), plan.requestId).finally(() => {
      this.#inFlight.delete(work);
    });
    this.#inFlight.add(work);
  }

  /** Resolves when every settlement started so far has finished. */
  async drain(): Promise<void> {
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
  }

  async #withRetries(run: () => Promise<void>, requestId: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await run();
      } catch (err) {
        const delay = RETRY_DELAYS_MS[attempt];
        if (delay === undefined) {
          this.#log.error({ err, requestId }, 'settlement failed; the hold will expire');
          return;
        }
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }
}

/** Through the group-commit writer: settlements that finish together share one transaction. */
async function settleOnce(deps: AppDeps, writer: GatewayWriter, plan: ForwardPlan, outcome: RelayOutcome): Promise<void> {
  const succeeded = outcome.kind === 'answered' && outcome.status < 400;
  if (!succeeded) {
    await writer.run(FAIL_JOB, { recordId: plan.recordId, holdIds: plan.holdIds });
    return;
  }
  const usage = outcome.usage;
  const model = plan.target.provider.modelFrom(plan.requestJson, plan.target.publicUrl, outcome.responseBody) ?? plan.model;
  await writer.run(SETTLE_JOB, {
    recordId: plan.recordId,
    holdIds: plan.holdIds,
    billing: plan.billing,
    usage: toUsage(usage),
    model,
    prices: plan.prices,
    baseCostCharged: plan.providerKeyType === 'managed' && plan.prices !== null,
    serviceChargeRate: plan.billing.serviceChargeRate ?? deps.config.serviceChargeRate,
    responseId: usage?.responseId ?? plan.target.provider.responseId(outcome.responseBody),
    usageEstimated: isEstimated(usage),
    record: { provider: plan.target.provider.id, endpoint: plan.endpoint, provider_key_type: plan.providerKeyType, metadata: plan.metadata },
  });
}

function isEstimated(usage: UsageReport | StreamUsage | null): boolean {
  return usage !== null && 'estimated' in usage && usage.estimated;
}

function toUsage(report: UsageReport | null): Usage {
  const inputTokens = report?.inputTokens ?? 0;
  // Cache counts are parts of the input; a provider reporting more than the whole must not make
  // the settlement throw (and so go uncharged): the parts are capped at the input total.
  const cachedInputTokens = Math.min(report?.cachedInputTokens ?? 0, inputTokens);
  const cacheWriteInputTokens = Math.min(report?.cacheWriteInputTokens ?? 0, inputTokens - cachedInputTokens);
  return {
    inputTokens,
    outputTokens: report?.outputTokens ?? 0,
    inputCharacters: report?.inputCharacters ?? 0,
    outputCharacters: report?.outputCharacters ?? 0,
    inputSeconds: toSeconds(report?.inputSeconds ?? 0),
    outputSeconds: toSeconds(report?.outputSeconds ?? 0),
    cachedInputTokens,
    cacheWriteInputTokens,
  };
}

/** Releases holds past their TTL and marks their records `error` (a crashed or stuck settlement). */
export async function sweepExpiredHolds(storage: Storage, now = new Date()): Promise<number> {
  const references = await expireHolds(storage, now);
  for (const recordId of new Set(references)) await failRequest(storage, { recordId, holdIds: [] });
  return references.length;
}
