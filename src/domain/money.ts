/**
 * Money is a bigint count of 1e-10 units. It crosses the wire as a decimal string with
 * exactly 10 fractional digits ("0.0581000000"). No JS number ever holds an amount.
 */
export const SCALE = 10;
export const UNIT = 10n ** BigInt(SCALE);

/**
 * The largest amount Tollgate stores in one place: 100,000,000.0000000000. BIGINT columns hold
 * up to ~9.2e18 units; this leaves room for sums of many such amounts without overflow.
 */
export const MAX_AMOUNT_UNITS = 10n ** 18n;

const DECIMAL = /^(-)?(\d+)(?:\.(\d+))?$/;

export class MoneyFormatError extends Error {}

/** Parses a decimal string (at most 10 fractional digits) into units. */
export function parseMoney(text: string): bigint {
  const m = DECIMAL.exec(text.trim());
  if (!m) throw new MoneyFormatError(`"${text}" is not a decimal number`);
  const [, sign, whole = '0', frac = ''] = m;
  if (frac.length > SCALE) throw new MoneyFormatError(`"${text}" has more than ${SCALE} fractional digits`);
  const units = BigInt(whole) * UNIT + BigInt(frac.padEnd(SCALE, '0'));
  return sign ? -units : units;
}

/** Formats units as a decimal string with exactly 10 fractional digits. */
export function formatMoney(units: bigint): string {
  const negative = units < 0n;
  const abs = negative ? -units : units;
  const whole = abs / UNIT;
  const frac = (abs % UNIT).toString().padStart(SCALE, '0');
  return `${negative ? '-' : ''}${whole}.${frac}`;
}

/** Divides and rounds half away from zero: the one rounding rule of Tollgate. */
export function divRoundHalfUp(numerator: bigint, denominator: bigint): bigint {
  if (denominator === 0n) throw new RangeError('division by zero');
  const negative = numerator < 0n !== denominator < 0n;
  const n = numerator < 0n ? -numerator : numerator;
  const d = denominator < 0n ? -denominator : denominator;
  const q = (n * 2n + d) / (d * 2n);
  return negative ? -q : q;
}
