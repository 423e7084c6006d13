import { describe, expect, it } from 'vitest';
import { exactText, useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * Creating and editing meters from the dashboard in real Chromium, through the schema and service
 * of POST and PATCH /v1/meters: refused fields say why beside themselves (a tier by its line),
 * the price preview follows the tiers as they are typed, and the API returns what was saved.
 */
describe('dashboard meter forms (Chromium)', () => {
  const d = useSignedInDashboard('meter-forms@shop.example');
  let meterId: string;
  const post = async (button: string) => {
    const [response] = await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: button }).click()]);
    return response.status();
  };

  it('previews the price of the tiers being typed, before anything is saved', async () => {
    await d.visit('/dashboard/meters', 'meter-create-form');
    await d.page.getByLabel('Tiers').fill('0 3.00\n1000000 1.50');
    await d.page.getByLabel(/Usage of one request/).fill('2000000');
    // 1M tokens at 3.00 and 1M at 1.50 per million, priced by the server's pricing code as typed.
    await d.page.waitForFunction(() => document.querySelector('#preview-fee data')?.getAttribute('value') === '4.5000000000');
    expect(await d.page.textContent('#preview-fee')).toBe('$4.50');
    await d.page.getByLabel('Rate', { exact: true }).selectOption('percentage');
    await d.page.getByLabel('Tiers').fill('0 20');
    await d.page.getByLabel('Provider cost of the request').fill('0.50');
    await d.page.waitForFunction(() => document.querySelector('#preview-fee data')?.getAttribute('value') === '0.1000000000');
    await d.page.getByLabel('Tiers').fill('5 20');
    await d.page.waitForFunction(() => (document.querySelector('#preview-fee')?.textContent ?? '').includes('first tier must start at 0'));
    expect((await d.api('GET', '/v1/meters')).body.data).toEqual([]);
  });

  it('refuses a blank name, then a bad tier, each beside its field, keeping what was typed', async () => {
    await d.page.goto(`${d.base}/dashboard/meters`);
    await d.page.getByLabel('Name').fill('  ');
    await d.page.getByLabel('Tiers').fill('0 2.00\n1000 two');
    expect(await post('Create meter')).toBe(400);
    expect(await d.page.textContent('#meter-name-error')).toBe('Name is required.');
    // The tiers are checked by the pricing rules once the fields pass the schema, as in the API.
    await d.page.getByLabel('Name').fill('Chat');
    expect(await post('Create meter')).toBe(400);
    expect(await d.page.locator('#meter-name-error').count()).toBe(0);
    expect(await d.page.textContent('#meter-tiers-error')).toBe('Tiers, line 2: rate must be a decimal string with at most 10 fractional digits');
    expect(await d.page.getAttribute('#meter-tiers', 'aria-invalid')).toBe('true');
    expect(await d.page.getByLabel('Tiers').inputValue()).toBe('0 2.00\n1000 two');
    expect(await d.page.textContent('main')).not.toMatch(/Too small|expected string|>=/);
    expect((await d.api('GET', '/v1/meters')).body.data).toEqual([]);
  });

  it('creates a tiered percentage meter with its payers and token basis, as POST /v1/meters would', async () => {
    await d.page.goto(`${d.base}/dashboard/meters`);
    await d.page.getByLabel('Name').fill('Chat margin');
    await d.page.getByLabel('Slug (optional)').fill('chat-margin');
    await d.page.getByLabel('Rate', { exact: true }).selectOption('percentage');
    await d.page.getByLabel('Unit', { exact: true }).selectOption('tokens_1m');
    await d.page.getByLabel('Tokens counted').selectOption('output');
    await d.page.getByLabel('Provider cost paid by').selectOption('merchant');
    await d.page.getByLabel('Tiers').fill('0 20\n5000000 10.5');
    expect(await post('Create meter')).toBe(303);
    await d.page.waitForSelector('#meter-notice');
    const [meter] = (await d.api('GET', '/v1/meters')).body.data;
    meterId = meter.meter_id;
    expect(d.page.url()).toBe(`${d.base}/dashboard/meters/${meterId}?created=1`);
    expect(meter).toMatchObject({
      name: 'Chat margin',
      meter_slug: 'chat-margin',
      rate_type: 'percentage',
      tier_type: 'tokens_1m',
      token_basis: 'output',
      base_cost_payer: 'merchant',
      service_charge_payer: 'wallet',
      tiers: [{ start: 0, rate: '20.0000000000' }, { start: 5000000, rate: '10.5000000000' }],
    });
    // A slug another meter has is refused at the slug field.
    await d.page.goto(`${d.base}/dashboard/meters`);
    await d.page.getByLabel('Name').fill('Copy');
    await d.page.getByLabel('Slug (optional)').fill('chat-margin');
    expect(await post('Create meter')).toBe(409);
    expect(await d.page.textContent('#meter-slug-error')).toContain('Slug:');
    expect((await d.api('GET', '/v1/meters')).body.data).toHaveLength(1);
  });

  it('edits the name and tiers on the meter page, and previews the saved tiers without JavaScript', async () => {
    await d.visit(`/dashboard/meters/${meterId}`, 'meter-edit-form');
    await d.page.getByLabel('Name').fill('Chat margin v2');
    await d.page.getByLabel(/^Tiers/).fill('0 25');
    expect(await post('Save meter')).toBe(303);
    await d.page.waitForSelector('#meter-notice');
    const meter = (await d.api('GET', `/v1/meters/${meterId}`)).body;
    expect(meter).toMatchObject({ name: 'Chat margin v2', rate_type: 'percentage', tiers: [{ start: 0, rate: '25.0000000000' }] });
    // The GET form alone (no script involved) prices the saved tiers: 25% of 2.00.
    const plain = await d.browser.newContext({ javaScriptEnabled: false, storageState: await d.context.storageState() });
    const page = await plain.newPage();
    await page.goto(`${d.base}/dashboard/meters/${meterId}`);
    await page.getByLabel('Provider cost of the request').fill('2.00');
    await page.getByRole('button', { name: 'Preview' }).click();
    await page.waitForURL((u) => u.searchParams.get('cost') === '2.00');
    expect(await exactText(page, '#preview-fee')).toBe('0.5000000000');
    await plain.close();
  });
});
