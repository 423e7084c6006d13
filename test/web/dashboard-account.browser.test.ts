import { describe, expect, it } from 'vitest';
import { useSignedInDashboard } from '../helpers/dashboard.ts';

const OLD_PASSWORD = 'a long enough password';
const NEW_PASSWORD = 'a brand new passphrase';

/**
 * Changing the password from the dashboard in real Chromium: the current password is required,
 * each mistake is named at its field, and after the change the old password no longer signs in,
 * another browser's session has ended, and this browser stays signed in.
 */
describe('dashboard account: change password (Chromium)', () => {
  const d = useSignedInDashboard('account@shop.example');

  const submit = async (current: string, next: string, again: string) => {
    await d.page.getByLabel('Current password').fill(current);
    await d.page.getByLabel('New password', { exact: true }).fill(next);
    await d.page.getByLabel('New password again').fill(again);
    await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: 'Change password' }).click()]);
  };

  const signInElsewhere = async (password: string): Promise<string> => {
    const context = await d.browser.newContext();
    const page = await context.newPage();
    await page.goto(`${d.base}/dashboard/sign-in`);
    await page.getByLabel('Email').fill('account@shop.example');
    await page.getByLabel('Password').fill(password);
    await Promise.all([page.waitForLoadState('load'), page.getByRole('button', { name: 'Sign in' }).click()]);
    await page.waitForLoadState('load');
    const path = new URL(page.url()).pathname;
    await context.close();
    return path;
  };

  it('shows the account and the change form, reachable from the navigation', async () => {
    await d.page.goto(`${d.base}/dashboard`);
    await d.page.getByRole('link', { name: 'Account' }).click();
    await d.page.waitForURL((u) => u.pathname === '/dashboard/account');
    await d.visit('/dashboard/account', 'account');
    expect(await d.page.textContent('main')).toContain('account@shop.example');
  });

  it('refuses a wrong current password and a mismatched repetition, naming the field', async () => {
    await submit('not my password', NEW_PASSWORD, NEW_PASSWORD);
    expect(await d.page.getByLabel('Current password').getAttribute('aria-invalid')).toBe('true');
    expect(await d.page.textContent('#current_password-error')).toBe('This is not your current password.');

    await submit(OLD_PASSWORD, NEW_PASSWORD, 'a brand new passphrasE');
    expect(await d.page.getByLabel('New password again').getAttribute('aria-invalid')).toBe('true');
    expect(await d.page.textContent('#confirm_password-error')).toContain('differ');
    expect(await signInElsewhere(OLD_PASSWORD)).toBe('/dashboard');
  });

  it('changes the password: old one refused, other sessions ended, this browser still signed in', async () => {
    const other = await d.browser.newContext();
    const otherPage = await other.newPage();
    await otherPage.goto(`${d.base}/dashboard/sign-in`);
    await otherPage.getByLabel('Email').fill('account@shop.example');
    await otherPage.getByLabel('Password').fill(OLD_PASSWORD);
    await otherPage.getByRole('button', { name: 'Sign in' }).click();
    await otherPage.waitForURL((u) => u.pathname === '/dashboard');

    await d.page.goto(`${d.base}/dashboard/account`);
    await submit(OLD_PASSWORD, NEW_PASSWORD, NEW_PASSWORD);
    expect(await d.page.textContent('#password-changed')).toContain('Password changed');
    expect(await d.page.textContent('main')).not.toContain('was not changed');

    await otherPage.goto(`${d.base}/dashboard/customers`);
    expect(new URL(otherPage.url()).pathname).toBe('/dashboard/sign-in');
    await other.close();

    await d.page.goto(`${d.base}/dashboard/customers`);
    expect(new URL(d.page.url()).pathname).toBe('/dashboard/customers');
    expect(await signInElsewhere(OLD_PASSWORD)).toBe('/dashboard/sign-in');
    expect(await signInElsewhere(NEW_PASSWORD)).toBe('/dashboard');
  });
});
