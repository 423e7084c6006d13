import { newId } from '../../src/domain/ids.ts';
import { parseMoney } from '../../src/domain/money.ts';
import type { BillingContext } from '../../src/ledger/billing.ts';
import type { AdmitInput } from '../../src/ledger/admission/admit.ts';
import type { PendingFacts, SettleInput } from '../../src/ledger/settlement/settle.ts';

/** What a forwarded chat completion's pending record says, unless a test names other facts. */
export const CHAT_FACTS: Omit<PendingFacts, 'created_at'> = {
  provider: 'openai',
  endpoint: 'POST https://api.openai.com/v1/chat/completions',
  provider_key_type: 'managed',
  metadata: {},
};

/**
 * A gateway admission holding `hold` on `walletId` (the merchant holds nothing): what the test
 * names, over the usual rest (a fresh request id, a 60 s hold, a gpt-4o chat completion).
 */
export function admissionOf(
  billing: BillingContext,
  walletId: string,
  given: { hold: string; facts?: Omit<PendingFacts, 'created_at'>; ttlMs?: number; now?: Date },
): AdmitInput {
  return {
    requestId: newId('request'),
    billing,
    walletId,
    estimate: { wallet: parseMoney(given.hold), merchant: 0n },
    ttlMs: given.ttlMs ?? 60_000,
    record: { ...(given.facts ?? CHAT_FACTS), model: 'gpt-4o' },
    // A test that does not move time admits at the wall clock's now.
    now: given.now ?? new Date(),
  };
}

/** Token usage with no characters or seconds, as a chat completion reports it. */
export function tokenUsage(inputTokens: number, outputTokens: number): SettleInput['usage'] {
  return { inputTokens, outputTokens, inputCharacters: 0, outputCharacters: 0, inputSeconds: '0', outputSeconds: '0' };
}

/**
 * The settlement of an admitted gateway request: what the test names, over the usual rest
 * (gpt-4o, no base prices, no service charge, exact usage).
 */
export function settlementOf(
  admitted: { recordId: string; holdIds: string[]; createdAt: string },
  given: Pick<SettleInput, 'billing' | 'usage'> & Partial<Omit<SettleInput, 'record'>> & { record?: Omit<PendingFacts, 'created_at'> },
): SettleInput {
  const { record, ...rest } = given;
  return {
    recordId: admitted.recordId,
    holdIds: admitted.holdIds,
    model: 'gpt-4o',
    prices: null,
    baseCostCharged: false,
    serviceChargeRate: 0n,
    responseId: null,
    usageEstimated: false,
    now: new Date(),
    ...rest,
    // What the pending record says is what its admission wrote.
    ...(record ? { record: { ...record, created_at: admitted.createdAt } } : {}),
  };
}
