/**
 * Money is a bigint count of 1e-10 units. It crosses the wire as a decimal string with
 * exactly 10 fractional digits ("0.0581000000"). No JS number ever holds an amount.
 */
export const SCALE = 10;
export const UNIT = 10n ** BigInt(SCALE);

/**
 * The largest single amount Tollgate accepts (a grant, a price, a charge): 100,000,000.0000000000.
 * BIGINT columns hold up to ~9.2e18 units, about 9.2 times this.
 */
export const MAX_AMOUNT_UNITS = 10n ** 18n;

/**
 * The largest balance a wallet may reach by a credit, a grant or a plan's credit: also
 * 100,000,000.0000000000. Without it, repeated grants would run a balance past what a BIGINT holds.
 */
export const MAX_WALLET_BALANCE_UNITS = 10n ** 18n;

/** What a signed 64-bit column holds: the hard ceiling for money a customer already paid. */
export const STORAGE_MAX_UNITS = 2n ** 63n - 1n;

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
