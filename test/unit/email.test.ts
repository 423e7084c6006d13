import { domainToASCII } from 'node:url';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isValidEmail } from '../../src/domain/email.ts';

describe('isValidEmail: the HTML standard’s valid email address, IDN domains judged in punycode', () => {
  it.each([
    'a@b.c',
    'user@bücher.example',
    'user@xn--bcher-kva.example',
    'ops@localhost',
    'first.last+tag@mail.sub.example.co',
    "o'brien!#$%&*/=?^_`{|}~-@example.com",
    '.dots..anywhere.@example.com',
    'x@a-b.c-d',
    `x@${'a'.repeat(63)}.example`,
    'user@例え.テスト',
  ])('accepts %s', (email) => {
    expect(isValidEmail(email)).toBe(true);
  });

  it.each([
    '',
    'a',
    '@b.c',
    'a@',
    'a b@c.d',
    'a@b c.d',
    'a@-b.c',
    'a@b-.c',
    'a@b..c',
    'a@.b',
    'a@b.',
    '"quoted"@example.com',
    'a@[127.0.0.1]',
    'a@b_c.d',
    'ü@example.com',
    'a@b@c.d',
    'user@bü cher.example',
    `x@${'a'.repeat(64)}.example`,
    `${'x'.repeat(310)}@example.com`,
  ])('refuses %j', (email) => {
    expect(isValidEmail(email)).toBe(false);
  });

  it('judges a Unicode domain exactly as its punycode form', () => {
    const label = fc.stringMatching(/^[a-zäöüßçéñ0-9]([a-zäöüßçéñ0-9-]{0,10}[a-zäöüßçéñ0-9])?$/);
    fc.assert(
      fc.property(fc.array(label, { minLength: 1, maxLength: 3 }), (labels) => {
        const domain = labels.join('.');
        const ascii = domainToASCII(domain);
        fc.pre(ascii !== '');
        expect(isValidEmail(`user@${domain}`)).toBe(isValidEmail(`user@${ascii}`));
      }),
    );
  });
});
