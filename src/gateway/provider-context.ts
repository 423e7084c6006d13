/**
 * Sizes of context a provider keeps between requests (decision 0025): a Responses API request that
 * names `previous_response_id` is billed for the whole conversation so far, a Gemini request that
 * names `cachedContent` for the cached tokens, a stored prompt for its text. None of it is in the
 * request's body, so the body alone holds too little. The gateway learns each context's size
 * from the usage of the requests that made or used it, and holds for it when a request names it:
 *  - an answer that can be named later (a `resp_…` id): its input plus its output tokens, the
 *    conversation a follow-up carries;
 *  - a context a request named: that request's input tokens, which include it.
 * A context this instance has not seen (made before it started, by another instance, or directly
 * with the provider) is held at the operator's allowance, PROVIDER_CONTEXT_HOLD_TOKENS. Keys are
 * the merchant's: one merchant's requests never size another's holds.
 */
import type { HoldRules } from '../providers/types.ts';

/** Enough for the live conversations of a busy instance; the oldest are forgotten first. */
const MAX_REMEMBERED = 100_000;

export class ProviderContextSizes {
  readonly #tokens = new Map<string, number>();
  readonly #max: number;

  constructor(max = MAX_REMEMBERED) {
    this.#max = max;
  }

  /** The keys of the provider-side context `body` names, the merchant's own. */
  static referencesOf(merchantId: string, rules: HoldRules, body: unknown): string[] {
    return (rules.contextReferences?.(body) ?? []).map((key) => `${merchantId}:${key}`);
  }

  /** Input tokens to hold for the named contexts: each one's last known size, else `allowance`. */
  tokensFor(keys: readonly string[], allowance: number): number {
    return keys.reduce((sum, key) => sum + (this.#tokens.get(key) ?? allowance), 0);
  }

  /** What a settled request shows about the contexts it named and the one its answer starts. */
  learn(
    learned: { merchantId: string; keys: readonly string[]; rules: HoldRules },
    usage: { inputTokens: number; outputTokens: number; responseId?: string | null },
  ): void {
    for (const key of learned.keys) this.#remember(key, usage.inputTokens);
    const answer = usage.responseId ? learned.rules.answerContextReference?.(usage.responseId) : null;
    if (answer) this.#remember(`${learned.merchantId}:${answer}`, usage.inputTokens + usage.outputTokens);
  }

  #remember(key: string, tokens: number): void {
    if (!Number.isSafeInteger(tokens) || tokens <= 0) return;
    // Re-inserted so the Map's order is by last use: the oldest is forgotten first.
    this.#tokens.delete(key);
    this.#tokens.set(key, tokens);
    if (this.#tokens.size > this.#max) this.#tokens.delete(this.#tokens.keys().next().value!);
  }
}
