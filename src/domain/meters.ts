import { formatMoney, MAX_AMOUNT_UNITS, MoneyFormatError, parseMoney } from './money.ts';

export const RATE_TYPES = ['fixed', 'percentage'] as const;
export const TIER_TYPES = ['tokens_1m', 'characters_1m', 'minutes', 'requests'] as const;
export const TOKEN_BASES = ['input+output', 'output'] as const;
export const PAYERS = ['wallet', 'merchant'] as const;

export type TierType = (typeof TIER_TYPES)[number];

/** A tier as stored: `start` in the meter's unit, `rate` in 1e-10 units. */
export type Tier = { start: number; rate: bigint };

export type TierProblem = { index: number; field: 'start' | 'rate' | null; message: string };

/**
 * Checks a tier list: first tier starts at 0, starts strictly ascending,
 * rates non-negative decimals with at most 10 fractional digits.
 */
export function parseTiers(input: { start: string | number; rate: string }[]): Tier[] | TierProblem[] {
  const problems: TierProblem[] = [];
  const tiers: Tier[] = [];
  input.forEach((raw, index) => {
    const start = parseStart(raw.start);
    if (start === null) problems.push({ index, field: 'start', message: 'start must be a non-negative integer' });
    const rate = parseRate(raw.rate);
    if (typeof rate === 'string') problems.push({ index, field: 'rate', message: rate });
    if (start !== null && typeof rate === 'bigint') tiers.push({ start, rate });
  });
  if (problems.length > 0) return problems;
  if (tiers.length === 0) return [{ index: 0, field: null, message: 'at least one tier is required' }];
  if (tiers[0]!.start !== 0) return [{ index: 0, field: 'start', message: 'the first tier must start at 0' }];
  for (let i = 1; i < tiers.length; i++) {
    if (tiers[i]!.start <= tiers[i - 1]!.start) {
      return [{ index: i, field: 'start', message: 'tier starts must be strictly ascending' }];
    }
  }
  return tiers;
}

export function isTierList(v: Tier[] | TierProblem[]): v is Tier[] {
  return v.length === 0 || 'rate' in v[0]!;
}

function parseStart(value: string | number): number | null {
  const n = typeof value === 'number' ? value : /^\d+$/.test(value.trim()) ? Number(value.trim()) : NaN;
  return Number.isSafeInteger(n) && n >= 0 ? n : null;
}

function parseRate(value: string): bigint | string {
  try {
    const units = parseMoney(value);
    if (units < 0n) return 'rate must not be negative';
    // A larger rate could never be charged: every priced amount is bounded by the same maximum.
    if (units > MAX_AMOUNT_UNITS) return `rate must be at most ${formatMoney(MAX_AMOUNT_UNITS)}`;
    return units;
  } catch (e) {
    if (e instanceof MoneyFormatError) return `rate must be a decimal string with at most 10 fractional digits`;
    throw e;
  }
}

export function serializeTiers(tiers: Tier[]): string {
  return JSON.stringify(tiers.map((t) => ({ start: t.start, rate: formatMoney(t.rate) })));
}

export function deserializeTiers(json: string): Tier[] {
  return (JSON.parse(json) as { start: number; rate: string }[]).map((t) => ({ start: t.start, rate: parseMoney(t.rate) }));
}

/** A readable default slug from a meter's name: "GPT-4o Chat!" -> "gpt-4o-chat". */
export function slugify(name: string): string {
  const slug = name
    .toLowerCase()
    .normalize('NFKD')
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, 48);
  return slug || 'meter';
}
