import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { exactText, otherMerchantPage, useSignedInDashboard, tableValues } from '../helpers/dashboard.ts';

/**
 * The customers pages in real Chromium: the list with wallet buckets, a customer's detail with
 * its credit grants, and granting credit from the page — checked over the API, to the unit.
 */
describe('dashboard customers (Chromium)', () => {
  const d = useSignedInDashboard('customers@shop.example');
  let customer: { customer_id: string; wallet: { wallet_id: string } };
  const balanceOverApi = async () => (await d.api('GET', `/v1/customers/${customer.customer_id}`)).body.wallet.balance as string;

  it('says how to create a first customer when there is none', async () => {
    await d.visit('/dashboard/customers', 'customers-empty');
    const text = await d.page.textContent('main');
    expect(text).toContain('No customers yet');
    expect(text).toContain('POST $TOLLGATE/v1/customers');
  });

  it('lists customers with their balance split into prepaid, cycle and bundle credit', async () => {
    customer = (await d.api('POST', '/v1/customers', { name: 'Ada Lovelace', email: 'ada@example.com', reference_id: 'user-42' })).body;
    await creditWallet(d.t.storage, customer.wallet.wallet_id, parseMoney('10'), new Date().toISOString());
    await creditWallet(d.t.storage, customer.wallet.wallet_id, parseMoney('3.5'), new Date().toISOString(), 'cycle');
    await creditWallet(d.t.storage, customer.wallet.wallet_id, parseMoney('0.25'), new Date().toISOString(), 'bundle');
    // The app's clock stands still; moved past these credits, the grant below is the newest.
    d.t.clock.set(Date.now() + 1_000);
    await d.visit('/dashboard/customers', 'customers');
    const [row] = await tableValues(d.page, 'table');
    expect(row).toEqual([customer.customer_id, 'Ada Lovelace', 'user-42', await balanceOverApi(), '10.0000000000', '3.5000000000', '0.2500000000']);
    expect(await balanceOverApi()).toBe('13.7500000000');
  });

  it('grants credit from the customer page: the API sees the exact amount, and the grant is listed', async () => {
    await d.page.getByRole('link', { name: customer.customer_id }).click();
    await d.page.waitForURL((u) => u.pathname === `/dashboard/customers/${customer.customer_id}`);
    await d.visit(`/dashboard/customers/${customer.customer_id}`, 'customer');
    expect(await exactText(d.page, '#wallet-cycle')).toBe('3.5000000000');
    expect(await d.page.textContent('#wallet-cycle')).toBe('$3.50');
    await d.page.getByLabel('Amount').fill('12.3456789012');
    await d.page.getByLabel('Description (optional)').fill('Welcome credit');
    await d.page.getByRole('button', { name: 'Grant credit' }).click();
    await d.page.waitForSelector('#grant-notice');
    expect(await balanceOverApi()).toBe('26.0956789012');
    expect(await exactText(d.page, '#wallet-balance')).toBe('26.0956789012');
    expect(await d.page.textContent('#wallet-balance')).toBe('$26.0957');
    expect(await d.page.getAttribute('#wallet-balance data', 'title')).toBe('26.0956789012 USD');
    expect(await exactText(d.page, '#grant-notice')).toContain('Granted 12.3456789012');
    const credits = await tableValues(d.page, '#credits');
    expect(credits[0]!.slice(1)).toEqual(['Granted by you', 'prepaid', '12.3456789012', 'Welcome credit']);
    expect(credits.map((c) => c[3])).toEqual(expect.arrayContaining(['10.0000000000', '3.5000000000', '0.2500000000']));
    await d.visit(`/dashboard/customers/${customer.customer_id}`, 'customer-granted');
  });

  it('grants credit with the keyboard alone: skip link to the content, Tab to the labelled field, Enter to submit', async () => {
    const before = parseMoney(await balanceOverApi());
    await d.page.goto(`${d.base}/dashboard/customers/${customer.customer_id}`);
    await d.page.keyboard.press('Tab');
    expect(await d.page.evaluate(() => document.activeElement?.textContent)).toBe('Skip to content');
    await d.page.keyboard.press('Enter');
    expect(await d.page.evaluate(() => document.activeElement?.id)).toBe('main');
    for (let i = 0; i < 30 && (await d.page.evaluate(() => document.activeElement?.id)) !== 'grant-amount'; i++) await d.page.keyboard.press('Tab');
    expect(await d.page.evaluate(() => (document.activeElement as HTMLInputElement).labels?.[0]?.textContent)).toBe('Amount');
    await d.page.keyboard.type('1.5');
    await d.page.keyboard.press('Enter');
    await d.page.waitForSelector('#grant-notice');
    expect(parseMoney(await balanceOverApi()) - before).toBe(parseMoney('1.5'));
  });

  it('refuses amounts that are not exact positive decimals, saying why, and grants nothing', async () => {
    const before = await balanceOverApi();
    for (const amount of ['1e3', '-5', '0', '12.34567890123', 'ten', '0.1+0.2', '']) {
      await d.page.goto(`${d.base}/dashboard/customers/${customer.customer_id}`);
      await d.page.getByLabel('Amount').fill(amount);
      const [response] = await Promise.all([
        d.page.waitForResponse((r) => r.request().method() === 'POST'),
        d.page.getByRole('button', { name: 'Grant credit' }).click(),
      ]);
      expect(response.status(), amount).toBe(400);
      expect(await d.page.textContent('#grant-error'), amount).toContain('Enter the amount as a positive decimal number');
      expect(await d.page.getAttribute('#grant-amount', 'aria-invalid')).toBe('true');
    }
    expect(await d.page.locator('#grant-amount').inputValue()).toBe('');
    expect(await balanceOverApi()).toBe(before);
  });

  it('pages customers 50 at a time: "More customers" leads to the rest, and every customer appears once', async () => {
    for (let i = 0; i < 51; i++) await d.api('POST', '/v1/customers', { name: `Paged ${i}` });
    const overApi = (await d.api('GET', '/v1/customers?limit=100')).body.data.map((c: { customer_id: string }) => c.customer_id);
    expect(overApi).toHaveLength(52);

    await d.page.goto(`${d.base}/dashboard/customers`);
    const first = (await tableValues(d.page, 'table')).map((row) => row[0]);
    expect(first).toHaveLength(50);
    await d.page.getByRole('link', { name: 'More customers' }).click();
    await d.page.waitForURL((u) => u.searchParams.has('cursor'));
    const second = (await tableValues(d.page, 'table')).map((row) => row[0]);
    expect(second).toHaveLength(2);
    expect(await d.page.getByRole('link', { name: 'More customers' }).count()).toBe(0);
    expect([...first, ...second]).toEqual(overApi);
  });

  it("refuses a grant without its CSRF token, and another merchant's grant to this customer", async () => {
    const before = await balanceOverApi();
    const noToken = await d.page.request.post(`${d.base}/dashboard/customers/${customer.customer_id}/credits`, { form: { amount: '5' }, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);

    const other = await otherMerchantPage(d, 'other-customers@shop.example');
    await other.page.goto(`${d.base}/dashboard/customers`);
    expect(await other.page.textContent('main')).not.toContain(customer.customer_id);
    const token = await other.page.getAttribute('input[name=_csrf]', 'value');
    const page = await other.page.goto(`${d.base}/dashboard/customers/${customer.customer_id}`);
    expect(page!.status()).toBe(404);
    const grant = await other.page.request.post(`${d.base}/dashboard/customers/${customer.customer_id}/credits`, { form: { _csrf: token!, amount: '5' }, maxRedirects: 0 });
    expect(grant.status()).toBe(404);
    await other.close();
    expect(await balanceOverApi()).toBe(before);
  });
});
