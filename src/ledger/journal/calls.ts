/**
 * What the call journal says about a call (decision 0024): its admission, with everything its
 * pending record, its holds and its settlement are made from, and what its relay ended with. One
 * JSON line each; money stays exact (bigints are written as tagged decimal text).
 */
import type { BasePrices } from '../../domain/pricing.ts';
import type { AdmitInput } from '../admission/admit.ts';
import type { BillingContext } from '../billing.ts';
import type { SettleInput } from '../settlement/settle.ts';

/** A call as admitted: enough to write its pending record and holds, and to price its settlement. */
export type AdmittedCall = {
  id: string;
  /** The pending record's time, which the settled record keeps. */
  admittedAt: string;
  ttlMs: number;
  walletId: string;
  estimate: AdmitInput['estimate'];
  record: AdmitInput['record'];
  /** Who pays, as admitted; without the caller's own provider key (a secret, never on disk). */
  billing: BillingContext;
  prices: BasePrices | null;
  baseCostCharged: boolean;
  serviceChargeRate: bigint;
};

/** What a call's settlement is priced from, as its relay ended; null: nothing is billed (refused, unreachable). */
export type FinishedCall = {
  id: string;
  /** When it was settled, by the app's clock. */
  at: string;
  usage: Pick<SettleInput, 'usage' | 'model' | 'requestedModel' | 'responseId' | 'usageEstimated' | 'providerTimestamp'> | null;
};

export type JournalledCall = { admitted?: AdmittedCall; finished?: FinishedCall };

const BIGINT_TAG = '$bigint';

const bigintsTagged = (_key: string, value: unknown): unknown => (typeof value === 'bigint' ? { [BIGINT_TAG]: value.toString() } : value);

function bigintsRevived(_key: string, value: unknown): unknown {
  if (typeof value === 'object' && value !== null && BIGINT_TAG in value) {
    const text = (value as Record<string, unknown>)[BIGINT_TAG];
    if (typeof text === 'string' && Object.keys(value).length === 1) return BigInt(text);
  }
  return value;
}

/**
 * A credential's billing context, as JSON, once per context: the credential cache hands the same
 * object to every call it resolves, and its meter and spend-key rows are most of an entry.
 */
const billingLines = new WeakMap<BillingContext, string>();

function billingJson(billing: BillingContext): string {
  let json = billingLines.get(billing);
  if (json === undefined) {
    json = JSON.stringify({ ...billing, providerKey: null }, bigintsTagged);
    billingLines.set(billing, json);
  }
  return json;
}

/**
 * Metadata is the caller's: its keys and values could spell a bigint's tag, so it travels as JSON
 * text of its own, which the reviver never looks into.
 */
export function admittedLine(call: AdmittedCall): string {
  const { billing, record, ...rest } = call;
  const written = { ...rest, record: { ...record, metadata: JSON.stringify(record.metadata) } };
  return `{"k":"a","billing":${billingJson(billing)},"call":${JSON.stringify(written, bigintsTagged)}}`;
}

function admittedOf(call: Omit<AdmittedCall, 'billing'>, billing: BillingContext): AdmittedCall {
  const metadata = JSON.parse(call.record.metadata as unknown as string) as Record<string, string>;
  return { ...call, record: { ...call.record, metadata }, billing };
}

export function finishedLine(call: FinishedCall): string {
  return JSON.stringify({ k: 'f', call }, bigintsTagged);
}

/**
 * The journalled calls by id, from a journal's lines in order. A line that does not parse (cut
 * short by a power loss) is skipped: its call is then as if that entry had not been written.
 */
export function callsOf(lines: readonly string[]): Map<string, JournalledCall> {
  const calls = new Map<string, JournalledCall>();
  const of = (id: string) => {
    let call = calls.get(id);
    if (!call) calls.set(id, (call = {}));
    return call;
  };
  for (const line of lines) {
    let entry: { k?: unknown; call?: { id?: unknown }; billing?: BillingContext };
    try {
      entry = JSON.parse(line, bigintsRevived) as typeof entry;
    } catch {
      continue;
    }
    if (typeof entry.call?.id !== 'string') continue;
    if (entry.k === 'a' && entry.billing) of(entry.call.id).admitted = admittedOf(entry.call as Omit<AdmittedCall, 'billing'>, entry.billing);
    else if (entry.k === 'f') of(entry.call.id).finished = entry.call as FinishedCall;
  }
  return calls;
}
