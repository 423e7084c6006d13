import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { formatMoney, MAX_AMOUNT_UNITS, parseMoney } from '../../src/domain/money.ts';
import { customerLink, formatsFor } from '../../src/web/format.ts';

const usd = formatsFor('USD');
const amounts = fc.bigInt({ min: -MAX_AMOUNT_UNITS, max: MAX_AMOUNT_UNITS });

/** "$1,234.5678" or "-$0.50" back to units; null for the "< $0.0001" form. */
function shownUnits(text: string): bigint | null {
  if (text.includes('0.0001') && /[<>]/.test(text)) return null;
  return parseMoney(text.replace('$', '').replace(/,/g, ''));
}

describe('dashboard number formats', () => {
  it('writes money with the symbol, separators and 2 to 4 decimals, the exact value in value and title', () => {
    expect(usd.money(parseMoney('41.22588401')).value).toBe(
      '<data class="amount rounded" value="41.2258840100" title="41.2258840100 USD">$41.2259</data>',
    );
    expect(usd.moneyText(parseMoney('1234567.5'))).toBe('$1,234,567.50');
    expect(usd.moneyText('20.0000000000')).toBe('$20.00');
    expect(usd.moneyText('0.125')).toBe('$0.125');
    expect(usd.moneyText('-3.5')).toBe('-$3.50');
    expect(usd.moneyText('0.0000000001')).toBe('< $0.0001');
    expect(usd.moneyText('-0.0000000001')).toBe('> -$0.0001');
    expect(formatsFor('EUR').moneyText('1.5')).toBe('€1.50');
    expect(formatsFor('chf').moneyText('1000')).toBe('CHF 1,000.00');
  });

  it('shows every amount within half a ten-thousandth of its exact value, never 0 for a non-zero one', () => {
    fc.assert(
      fc.property(amounts, (units) => {
        const text = usd.moneyText(units);
        const shown = shownUnits(text);
        if (shown === null) {
          expect(units).not.toBe(0n);
          expect(units < 500_000n && units > -500_000n).toBe(true);
          return;
        }
        const diff = shown - units;
        expect(diff <= 500_000n && diff >= -500_000n).toBe(true);
        expect(text).toMatch(/^-?\$\d{1,3}(,\d{3})*\.\d{2,4}$/);
        const markup = usd.money(units).value;
        expect(markup).toContain(`value="${formatMoney(units)}"`);
        expect(markup.includes('rounded')).toBe(shown !== units);
      }),
    );
  });

  it('writes percentages with %, trailing zeros dropped, the exact rate in the title', () => {
    expect(usd.percent('20.0000000000').value).toBe('<data class="amount" value="20.0000000000" title="20.0000000000%">20%</data>');
    expect(usd.percent('12.5').value).toContain('>12.5%<');
    expect(usd.percent('100').value).toContain('>100%<');
    expect(usd.percent('0.33333').value).toContain('>0.3333%<');
  });

  it('groups counts by thousands', () => {
    expect(usd.count(0)).toBe('0');
    expect(usd.count(1234)).toBe('1,234');
    expect(usd.count(12_345_678n)).toBe('12,345,678');
    expect(usd.count(1500.5)).toBe('1,500.5');
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 10n ** 20n }), (n) => {
        expect(BigInt(usd.count(n).replace(/,/g, ''))).toBe(n);
      }),
    );
  });

  it('links a customer by its name with the id on hover, and escapes both', () => {
    const names = new Map([['con_1', 'Ada <Lovelace>']]);
    expect(customerLink('con_1', names).value).toBe('<a href="/dashboard/customers/con_1" title="con_1">Ada &lt;Lovelace&gt;</a>');
    expect(customerLink('con_2', names).value).toBe('<a href="/dashboard/customers/con_2" title="con_2">con_2</a>');
    expect(customerLink(null, names).value).toContain('—');
  });
});
