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
  /** Who pays, as admitted; without the caller's own provider key and the meter's secret (never on disk). */
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

/** For the billing context (its rows' bigint columns); the call's own bigints are written by name. */
const bigintsTagged = (_key: string, value: unknown): unknown => (typeof value === 'bigint' ? { [BIGINT_TAG]: value.toString() } : value);

function bigintsRevived(_key: string, value: unknown): unknown {
  if (typeof value === 'object' && value !== null && BIGINT_TAG in value) {
    const text = (value as Record<string, unknown>)[BIGINT_TAG];
    if (typeof text === 'string' && Object.keys(value).length === 1) return BigInt(text);
  }
  return value;
}

/**
 * Parts of an entry many calls share, as JSON, made once per object: the credential cache hands
 * the same billing context to every call it resolves (its meter and spend-key rows are most of an
 * entry), and the price cache the same prices. An entry is written on every call's path, so it is
 * put together from these and a few fields rather than stringified whole (a third of the time).
 */
const billingLines = new WeakMap<BillingContext, string>();
const pricesLines = new WeakMap<BasePrices, string>();

function billingJson(billing: BillingContext): string {
  let json = billingLines.get(billing);
  if (json === undefined) {
    // Secrets stay off the disk: the caller's own provider key, and the meter's secret (a credential
    // that names the meter in forward tokens); a settlement needs neither.
    const meter = billing.meter && { ...billing.meter, secret: '' };
    json = JSON.stringify({ ...billing, providerKey: null, meter }, bigintsTagged);
    billingLines.set(billing, json);
  }
  return json;
}

function pricesJson(prices: BasePrices | null): string {
  if (prices === null) return 'null';
  let json = pricesLines.get(prices);
  if (json === undefined) {
    json = JSON.stringify(prices, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));
    pricesLines.set(prices, json);
  }
  return json;
}

/**
 * The admission entry. Metadata is the caller's, so it travels as JSON text of its own; the
 * call's bigints are written as decimal text and read back by name (callsOf).
 */
export function admittedLine(call: AdmittedCall): string {
  const { provider, model, endpoint, provider_key_type: keyType, metadata } = call.record;
  const { wallet, merchant, charge } = call.estimate;
  return (
    `{"k":"a","billing":${billingJson(call.billing)},"call":{"id":${JSON.stringify(call.id)},"admittedAt":"${call.admittedAt}","ttlMs":${call.ttlMs},` +
    `"walletId":${JSON.stringify(call.walletId)},"estimate":{"wallet":"${wallet}","merchant":"${merchant}","charge":${charge ? JSON.stringify(charge) : 'null'}},` +
    `"record":{"provider":${JSON.stringify(provider)},"model":${JSON.stringify(model)},"endpoint":${JSON.stringify(endpoint)},"provider_key_type":"${keyType}","metadata":${JSON.stringify(JSON.stringify(metadata))}},` +
    `"prices":${pricesJson(call.prices)},"baseCostCharged":${call.baseCostCharged},"serviceChargeRate":"${call.serviceChargeRate}"}}`
  );
}

/** The outcome entry: usage has no bigints (seconds are decimal text already). */
export function finishedLine(call: FinishedCall): string {
  return `{"k":"f","call":${JSON.stringify(call)}}`;
}

/** An admission entry's call as written, before its bigints and metadata are read back. */
type WrittenCall = Omit<AdmittedCall, 'billing' | 'estimate' | 'prices' | 'serviceChargeRate' | 'record'> & {
  estimate: { wallet: string; merchant: string; charge: AdmittedCall['estimate']['charge'] | null };
  record: Omit<AdmittedCall['record'], 'metadata'> & { metadata: string };
  prices: Record<string, string> | null;
  serviceChargeRate: string;
};

function admittedOf(call: WrittenCall, billing: BillingContext): AdmittedCall {
  const { charge, wallet, merchant } = call.estimate;
  const prices = call.prices && (Object.fromEntries(Object.entries(call.prices).map(([name, value]) => [name, BigInt(value)])) as unknown as BasePrices);
  return {
    ...call,
    estimate: { wallet: BigInt(wallet), merchant: BigInt(merchant), ...(charge ? { charge } : {}) },
    record: { ...call.record, metadata: JSON.parse(call.record.metadata) as Record<string, string> },
    prices,
    serviceChargeRate: BigInt(call.serviceChargeRate),
    billing,
  };
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
      // Only the billing context has tagged bigints; nothing else in a line is an object the
      // caller named (metadata is text), so nothing else can look like a tag.
      entry = JSON.parse(line, bigintsRevived) as typeof entry;
    } catch {
      continue;
    }
    const id = entry.call?.id;
    if (typeof id !== 'string') continue;
    if (entry.k === 'a' && entry.billing) of(id).admitted = admittedOf(entry.call as WrittenCall, entry.billing);
    else if (entry.k === 'f') of(id).finished = entry.call as FinishedCall;
  }
  return calls;
}
