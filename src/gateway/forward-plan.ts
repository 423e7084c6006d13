import type { BasePrices } from '../domain/pricing.ts';
import type { Metadata } from '../http/metadata.ts';
import type { AdmitInput } from '../ledger/admission/admit.ts';
import type { AdmissionWrite } from '../ledger/admission/deferred.ts';
import type { BillingContext } from '../ledger/billing.ts';
import type { JournalEntry } from '../ledger/journal/journal.ts';
import type { HoldRules } from '../providers/types.ts';
import type { ErrorDialect } from './error-dialects.ts';
import type { ResponseTranslator } from './relay.ts';
import type { ResolvedTarget } from './target.ts';

/**
 * Everything decided about a forwarded request before its provider is called (forward.ts
 * planForward), and what its settlement reads back (settle.ts). Its own module so the settlement
 * need not import the route that makes it.
 */
export type ForwardPlan = {
  requestId: string;
  /** What was admitted (the call journal writes it before the provider is called). */
  admission: AdmitInput;
  /** The call's place in the call journal, once written there. */
  journalled?: JournalEntry;
  recordId: string;
  holdIds: string[];
  /** When the request was admitted: the settled record keeps it. */
  admittedAt: string;
  /** A deferred admission (decision 0011): its settlement takes it over, or follows its write. */
  deferred?: AdmissionWrite;
  method: string;
  /** `METHOD url` as the record shows it. */
  endpoint: string;
  target: ResolvedTarget;
  billing: BillingContext;
  headers: Record<string, string>;
  body: Buffer | undefined;
  requestJson: unknown;
  hideInjectedUsage: boolean;
  model: string | null;
  prices: BasePrices | null;
  providerKeyType: 'managed' | 'unmanaged';
  metadata: Metadata;
  translator: ResponseTranslator | undefined;
  /** The dialect of an error Tollgate answers once the relay has begun (an unreachable provider). */
  dialect: ErrorDialect;
  /** The provider-side context the request names, whose size its usage tells (ProviderContextSizes). */
  contexts: { merchantId: string; keys: string[]; rules: HoldRules };
};
