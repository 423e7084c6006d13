import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { divRoundHalfUp, formatMoney, MoneyFormatError, parseMoney, SCALE, UNIT } from '../../src/domain/money.ts';

describe('parseMoney / formatMoney', () => {
  it.each([
    ['0', 0n, '0.0000000000'],
    ['1', UNIT, '1.0000000000'],
    ['1.5', 15_000_000_000n, '1.5000000000'],
    ['0.0581', 581_000_000n, '0.0581000000'],
    ['0.0000000001', 1n, '0.0000000001'],
    ['-0.0000000001', -1n, '-0.0000000001'],
    ['-12.25', -122_500_000_000n, '-12.2500000000'],
    ['007.10', 71_000_000_000n, '7.1000000000'],
    ['-0', 0n, '0.0000000000'],
    ['123456789012345678901234567890.0123456789', 1234567890123456789012345678900123456789n, '123456789012345678901234567890.0123456789'],
  ])('parses %s exactly and formats it with 10 fractional digits', (text, units, formatted) => {
    expect(parseMoney(text)).toBe(units);
    expect(formatMoney(units)).toBe(formatted);
  });

  it('keeps amounts beyond 2^53 units exact', () => {
    const big = 2n ** 80n + 1n;
    expect(parseMoney(formatMoney(big))).toBe(big);
  });

  it('rejects more than 10 fractional digits', () => {
    expect(() => parseMoney('0.00000000001')).toThrow(MoneyFormatError);
    expect(() => parseMoney('1.12345678901')).toThrow(/more than 10 fractional digits/);
    expect(() => parseMoney('-0.00000000000')).toThrow(MoneyFormatError);
  });

  it.each(['', 'abc', '1e5', '1.', '.5', '+1', '--1', '1,5', '1.2.3', 'NaN', 'Infinity', '0x10', '١'])(
    'rejects %j as not a decimal',
    (text) => {
      expect(() => parseMoney(text)).toThrow(MoneyFormatError);
    },
  );

  it('formats negative values with a single leading minus', () => {
    expect(formatMoney(-UNIT)).toBe('-1.0000000000');
    expect(formatMoney(-(UNIT / 2n))).toBe('-0.5000000000');
    expect(parseMoney('-1') + parseMoney('1')).toBe(0n);
  });

  it('round-trips every bigint: parseMoney(formatMoney(n)) === n', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(10n ** 40n), max: 10n ** 40n }), (n) => {
        const text = formatMoney(n);
        expect(text).toMatch(/^-?\d+\.\d{10}$/);
        expect(parseMoney(text)).toBe(n);
      }),
    );
  });

  it('normalizes any valid decimal string: formatMoney(parseMoney(x)) has 10 digits and the same value', () => {
    const decimal = fc.record({
      negative: fc.boolean(),
      whole: fc.string({ unit: fc.constantFrom(...'0123456789'), minLength: 1, maxLength: 25 }),
      frac: fc.option(fc.string({ unit: fc.constantFrom(...'0123456789'), minLength: 1, maxLength: SCALE })),
    });
    fc.assert(
      fc.property(decimal, ({ negative, whole, frac }) => {
        const text = `${negative ? '-' : ''}${whole}${frac === null ? '' : `.${frac}`}`;
        const formatted = formatMoney(parseMoney(text));
        // The same number, written independently: strip leading zeros, pad the fraction.
        const wholeDigits = whole.replace(/^0+(?=\d)/, '');
        const fracDigits = (frac ?? '').padEnd(SCALE, '0');
        const isZero = /^0+$/.test(wholeDigits + fracDigits);
        expect(formatted).toBe(`${negative && !isZero ? '-' : ''}${wholeDigits}.${fracDigits}`);
        // Normalizing is idempotent.
        expect(formatMoney(parseMoney(formatted))).toBe(formatted);
      }),
    );
  });
});

describe('divRoundHalfUp', () => {
  it.each([
    [5n, 2n, 3n],
    [-5n, 2n, -3n],
    [5n, -2n, -3n],
    [-5n, -2n, 3n],
    [7n, 2n, 4n],
    [-7n, 2n, -4n],
    [4n, 3n, 1n],
    [5n, 3n, 2n],
    [-4n, 3n, -1n],
    [-5n, 3n, -2n],
    [1n, 2n, 1n],
    [-1n, 2n, -1n],
    [1n, 3n, 0n],
    [-1n, 3n, 0n],
    [0n, 7n, 0n],
    [10n, 5n, 2n],
  ])('divRoundHalfUp(%s, %s) = %s', (n, d, q) => {
    expect(divRoundHalfUp(n, d)).toBe(q);
  });

  it('refuses division by zero', () => {
    expect(() => divRoundHalfUp(1n, 0n)).toThrow(RangeError);
  });

  it('rounds to the nearest integer, and halves away from zero (property)', () => {
    const nonZero = fc.bigInt({ min: -(10n ** 30n), max: 10n ** 30n }).filter((d) => d !== 0n);
    fc.assert(
      fc.property(fc.bigInt({ min: -(10n ** 40n), max: 10n ** 40n }), nonZero, (n, d) => {
        const q = divRoundHalfUp(n, d);
        const abs = (x: bigint) => (x < 0n ? -x : x);
        const twiceError = abs(2n * (n - q * d));
        // Nearest: the error is at most half a divisor.
        expect(twiceError <= abs(d)).toBe(true);
        // Ties go away from zero: |q·d| exceeds |n|.
        if (twiceError === abs(d)) expect(abs(q * d) > abs(n)).toBe(true);
        // Symmetric: negating the numerator negates the result.
        expect(divRoundHalfUp(-n, d)).toBe(-q);
      }),
    );
  });

  it('rounds exact halves of money units away from zero', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(10n ** 20n), max: 10n ** 20n }), (k) => {
        // (2k+1)/2 is an exact half: the result is k+1 for k >= 0 and k for k < 0.
        const q = divRoundHalfUp(2n * k + 1n, 2n);
        expect(q).toBe(k >= 0n ? k + 1n : k);
      }),
    );
  });
});
