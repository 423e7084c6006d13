import type { PendingFacts, SettleInput } from '../../src/ledger/forwarded.ts';

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
    ...rest,
    // What the pending record says is what its admission wrote.
    ...(record ? { record: { ...record, created_at: admitted.createdAt } } : {}),
  };
}
