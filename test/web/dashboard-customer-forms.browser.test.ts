import { describe, expect, it } from 'vitest';
import { useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * Creating and editing customers from the dashboard in real Chromium, through the same schema
 * and service as POST and PATCH /v1/customers: a refused field says why next to itself in plain
 * words, and what the form saved is what the API returns.
 */
describe('dashboard customer forms (Chromium)', () => {
  const d = useSignedInDashboard('customer-forms@shop.example');
  let customerId: string;
  const post = async (button: string) => {
    const [response] = await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: button }).click()]);
    return response.status();
  };

  it('refuses a bad email beside its field, keeps what was typed and creates nothing', async () => {
    await d.page.goto(`${d.base}/dashboard/customers`);
    await d.page.getByLabel('Name').fill('Grace Hopper');
    await d.page.getByLabel('Email').fill('grace-at-navy');
    expect(await post('Create customer')).toBe(400);
    expect(await d.page.textContent('#new-customer-email-error')).toBe('Email: must be a valid email address');
    expect(await d.page.getAttribute('#new-customer-email', 'aria-invalid')).toBe('true');
    expect(await d.page.getAttribute('#new-customer-email', 'aria-describedby')).toContain('new-customer-email-error');
    expect(await d.page.getByLabel('Name').inputValue()).toBe('Grace Hopper');
    expect(await d.page.textContent('#customer-create-error')).toContain('Nothing was saved');
    await d.visit('/dashboard/customers', 'customer-create-form');
    expect((await d.api('GET', '/v1/customers')).body.data).toEqual([]);
  });

  it('creates a customer from the form and opens its page; the API returns the same customer', async () => {
    await d.page.goto(`${d.base}/dashboard/customers`);
    await d.page.getByLabel('Name').fill('Grace Hopper');
    await d.page.getByLabel('Email').fill('grace@navy.example');
    await d.page.getByLabel('Reference id').fill('user-7');
    await d.page.getByLabel('Phone').fill('+1 555 0100');
    expect(await post('Create customer')).toBe(303);
    await d.page.waitForSelector('#customer-notice');
    const [customer] = (await d.api('GET', '/v1/customers')).body.data;
    customerId = customer.customer_id;
    expect(d.page.url()).toBe(`${d.base}/dashboard/customers/${customerId}?created=1`);
    expect(customer).toMatchObject({ reference_id: 'user-7', contact: { first_name: 'Grace', last_name: 'Hopper', email: 'grace@navy.example', phone: '+1 555 0100' } });
    // The API's idempotency on reference_id holds here too: the same reference opens that customer.
    await d.page.goto(`${d.base}/dashboard/customers`);
    await d.page.getByLabel('Reference id').fill('user-7');
    expect(await post('Create customer')).toBe(303);
    expect(await d.page.textContent('#customer-notice')).toContain('already has this reference id');
    expect((await d.api('GET', '/v1/customers')).body.data).toHaveLength(1);
  });

  it('edits the details on the customer page: a taken reference is refused at its field, a blank field clears its value', async () => {
    await d.api('POST', '/v1/customers', { reference_id: 'user-8' });
    await d.page.goto(`${d.base}/dashboard/customers/${customerId}`);
    expect(await d.page.getByLabel('Name').inputValue()).toBe('Grace Hopper');
    await d.page.getByLabel('Reference id').fill('user-8');
    expect(await post('Save details')).toBe(409);
    expect(await d.page.textContent('#customer-reference-id-error')).toContain('Reference id:');
    expect(await d.page.textContent('#customer-reference-id-error')).toContain('already uses this reference_id');
    await d.visit(`/dashboard/customers/${customerId}`, 'customer-edit-form');

    await d.page.getByLabel('Name').fill('Grace B. Hopper');
    await d.page.getByLabel('Reference id').fill('user-7b');
    await d.page.getByLabel('Phone').fill('');
    expect(await post('Save details')).toBe(303);
    await d.page.waitForSelector('#customer-notice');
    const customer = (await d.api('GET', `/v1/customers/${customerId}`)).body;
    expect(customer).toMatchObject({ reference_id: 'user-7b', contact: { first_name: 'Grace', last_name: 'B. Hopper', email: 'grace@navy.example', phone: null } });
  });

  it('refuses the forms without their CSRF token', async () => {
    const res = await d.page.request.post(`${d.base}/dashboard/customers`, { form: { name: 'Mallory' }, maxRedirects: 0 });
    expect(res.status()).toBe(403);
    const edit = await d.page.request.post(`${d.base}/dashboard/customers/${customerId}`, { form: { name: 'Mallory' }, maxRedirects: 0 });
    expect(edit.status()).toBe(403);
    expect((await d.api('GET', '/v1/customers')).body.data.map((c: { contact: { first_name: string | null } }) => c.contact.first_name)).not.toContain('Mallory');
  });
});
