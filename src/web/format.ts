import { divRoundHalfUp, formatMoney, parseMoney, SCALE } from '../domain/money.ts';
import { html, type SafeHtml } from './html.ts';

/**
 * How the dashboard writes numbers for people: money with the currency's symbol and 2 to 4
 * decimals, percentages with %, counts with thousands separators. The exact value (ten decimals,
 * as the API writes it) stays one hover away in a `<data value>` element's title, so a figure can
 * always be checked against the API. Every page formats through here, so they all agree.
 */
export type Formats = {
  /** An amount (units or the API's decimal string) as "$1,234.5678", exact value in its title. */
  money(amount: bigint | string): SafeHtml;
  /** The same amount as plain text, for places that cannot hold markup (a notice sentence, an aria-label). */
  moneyText(amount: bigint | string): string;
  /** A percentage rate (the API's decimal string or units of 1e-10 percent) as "12.5%". */
  percent(rate: bigint | string): SafeHtml;
  /** A count (tokens, requests, seconds) with thousands separators. */
  count(n: number | bigint): string;
  /** The ISO code every amount is in. */
  currency: string;
};

const SHOWN_DECIMALS = 4;
const MIN_DECIMALS = 2;
const DROPPED = 10n ** BigInt(SCALE - SHOWN_DECIMALS);

const toUnits = (amount: bigint | string): bigint => (typeof amount === 'bigint' ? amount : parseMoney(amount));

/** 1234567 → "1,234,567" (bigint-safe: no float on the way). */
function grouped(whole: bigint): string {
  return whole.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** The non-negative amount rounded half-up to 4 decimals, trailing zeros dropped down to 2. */
function shortDecimal(abs: bigint): string {
  const rounded = divRoundHalfUp(abs, DROPPED);
  const scale = 10n ** BigInt(SHOWN_DECIMALS);
  const fraction = (rounded % scale).toString().padStart(SHOWN_DECIMALS, '0');
  const trimmed = fraction.replace(/0+$/, '').padEnd(MIN_DECIMALS, '0');
  return `${grouped(rounded / scale)}.${trimmed}`;
}

/** Whether 4 decimals lose something of the value (the title then carries the rest). */
const isRounded = (units: bigint) => units % DROPPED !== 0n;

/** Where the currency's symbol goes: "$" right before the number, "CHF " with a space. */
function symbolOf(currency: string): { symbol: string; space: string } {
  try {
    const parts = new Intl.NumberFormat('en-US', { style: 'currency', currency }).formatToParts(1);
    const symbol = parts.find((p) => p.type === 'currency')?.value ?? currency;
    return { symbol, space: /^[A-Za-z]+$/.test(symbol) ? ' ' : '' };
  } catch {
    return { symbol: currency, space: ' ' };
  }
}

export function formatsFor(currency: string): Formats {
  const code = currency.toUpperCase();
  const { symbol, space } = symbolOf(code);
  const moneyText = (amount: bigint | string): string => {
    const units = toUnits(amount);
    const abs = units < 0n ? -units : units;
    const sign = units < 0n ? '-' : '';
    // A tiny non-zero amount is not written as 0.00: it says how small it is.
    if (abs !== 0n && abs < DROPPED / 2n) return `${units < 0n ? '> -' : '< '}${symbol}${space}0.0001`;
    return `${sign}${symbol}${space}${shortDecimal(abs)}`;
  };
  return {
    currency: code,
    moneyText,
    money(amount) {
      const units = toUnits(amount);
      const exact = formatMoney(units);
      return html`<data class="amount${isRounded(units) ? ' rounded' : ''}" value="${exact}" title="${exact} ${code}">${moneyText(units)}</data>`;
    },
    percent(rate) {
      const units = toUnits(rate);
      const exact = formatMoney(units);
      const abs = units < 0n ? -units : units;
      const shown = `${units < 0n ? '-' : ''}${shortDecimal(abs).replace(/\.?0+$/, '')}%`;
      return html`<data class="amount" value="${exact}" title="${exact}%">${shown}</data>`;
    },
    count(n) {
      const value = typeof n === 'bigint' ? n : BigInt(Math.trunc(n));
      const rest = typeof n === 'number' && !Number.isInteger(n) ? String(n).slice(String(Math.trunc(n)).length) : '';
      return `${value < 0n ? '-' : ''}${grouped(value < 0n ? -value : value)}${rest}`;
    },
  };
}

/**
 * A customer as people know it (its name, else email or reference) linking to its page, the id
 * one hover away; an id without a name found is shown as the id.
 */
export function customerLink(id: string | null | undefined, names: ReadonlyMap<string, string>): SafeHtml {
  if (!id) return html`<span class="muted">—</span>`;
  const name = names.get(id);
  return html`<a href="/dashboard/customers/${encodeURIComponent(id)}" title="${id}">${name ?? id}</a>`;
}
