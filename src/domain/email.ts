import { domainToASCII } from 'node:url';

/**
 * The HTML standard's "valid email address" (what a browser's `<input type="email">` accepts): a
 * local part of letters, digits and ``.!#$%&'*+/=?^_`{|}~-``, then `@`, then one or more dot-separated
 * labels of letters, digits and inner hyphens, each at most 63 characters. It asks for no dot in
 * the domain (`ops@localhost` is valid) and allows a one-letter top-level label (`a@b.c`).
 */
const WHATWG_EMAIL = /^[a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$/;

/** Longest address kept (RFC 5321's 64-character local part, `@`, 255-character domain). */
export const MAX_EMAIL_LENGTH = 320;

/**
 * Whether `email` is a valid email address, the one rule every entry point uses (API, hosted
 * checkout, dashboard, CLI). A domain in Unicode (`user@bücher.example`) is judged in its ASCII
 * (punycode) form, as browsers do before checking an email field; the address is kept as given.
 */
export function isValidEmail(email: string): boolean {
  if (email.length > MAX_EMAIL_LENGTH) return false;
  const at = email.lastIndexOf('@');
  if (at <= 0) return false;
  const domain = email.slice(at + 1);
  // domainToASCII('') and an undecodable domain both give '', which the pattern refuses.
  const asciiDomain = /^[\x21-\x7e]*$/.test(domain) ? domain : domainToASCII(domain);
  return WHATWG_EMAIL.test(`${email.slice(0, at)}@${asciiDomain}`);
}
