import { describe, expect, it } from 'vitest';
import { formatMoney } from '../../src/domain/money.ts';
import { newId } from '../../src/domain/ids.ts';
import { insertRefund } from '../../src/storage/payments.ts';
import type { PaymentsTable } from '../../src/storage/schema.ts';
import { useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * The payments page's CSV in real Chromium: the page's Export CSV link carries the page's
 * filters, and the file has every payment they match (1,201 here, more than two of its read
 * batches and far more than a page), exact amounts, refunds and the customer's name, streamed.
 */
describe('dashboard payments CSV (Chromium)', () => {
  const d = useSignedInDashboard('payments-csv@shop.example');
  const PAYMENTS = 1_201;

  it('exports every payment the page shows, filters included, with exact amounts and refunds', async () => {
    const customer = (await d.api('POST', '/v1/customers', { email: 'payer@example.com', first_name: 'Pat', last_name: 'Payer' })).body;
    const day = new Date(d.t.clock.now()).toISOString().slice(0, 10);
    const rows: PaymentsTable[] = Array.from({ length: PAYMENTS }, (_, i) => ({
      id: newId('payment'),
      merchant_id: d.merchantId,
      connection_id: customer.customer_id,
      provider: 'test',
      provider_ref: `pi_${i}`,
      purpose: i % 3 === 0 ? 'renewal' : 'checkout',
      reference: `csv-${i}`,
      amount: 1_0000000000n + BigInt(i),
      status: i % 7 === 0 ? 'failed' : 'succeeded',
      failure_reason: i % 7 === 0 ? 'card_declined' : null,
      credit_reference: null,
      created_at: `${day}T00:00:00.000Z`,
      updated_at: `${day}T00:00:00.000Z`,
    }));
    for (let i = 0; i < rows.length; i += 200) await d.t.storage.db.insertInto('payments').values(rows.slice(i, i + 200)).execute();
    const refunded = rows[1]!;
    await insertRefund(d.t.storage.db, {
      id: 'rfd_csv', merchant_id: d.merchantId, payment_id: refunded.id, amount: 2500000000n, credit_amount: 0n, wallet_id: null, bucket: null,
      provider_ref: 're_csv', status: 'succeeded', reason: null, failure_reason: null, created_at: refunded.created_at, updated_at: refunded.created_at,
    });

    await d.visit('/dashboard/payments', 'payments-csv');
    const href = await d.page.getByRole('link', { name: 'Export CSV' }).getAttribute('href');
    const csv = await d.page.request.get(`${d.base}${href}`);
    expect(csv.status()).toBe(200);
    expect(csv.headers()['content-type']).toContain('text/csv');
    expect(csv.headers()['content-length']).toBeUndefined();
    const lines = (await csv.text()).split('\r\n').filter(Boolean);
    expect(lines[0]).toBe('payment_id,created_at,customer_id,customer_name,kind,status,failure_reason,amount,refunded,provider,provider_reference');
    expect(lines).toHaveLength(1 + PAYMENTS);
    const byId = new Map(lines.slice(1).map((l) => [l.split(',')[0], l.split(',')]));
    expect(byId.size).toBe(PAYMENTS);
    for (const row of rows) {
      const cells = byId.get(row.id)!;
      expect(cells.slice(2, 8)).toEqual([customer.customer_id, 'Pat Payer', row.purpose, row.status, row.failure_reason ?? '', formatMoney(row.amount)]);
    }
    expect(byId.get(refunded.id)![8]).toBe('0.2500000000');

    // The filters the page shows are the filters the file has.
    await d.page.getByLabel('Status', { exact: true }).selectOption('failed');
    await d.page.getByLabel('Kind', { exact: true }).selectOption('renewal');
    await Promise.all([d.page.waitForURL((u) => u.searchParams.get('status') === 'failed'), d.page.getByRole('button', { name: 'Show' }).click()]);
    const filteredHref = await d.page.getByRole('link', { name: 'Export CSV' }).getAttribute('href');
    const filtered = (await (await d.page.request.get(`${d.base}${filteredHref}`)).text()).split('\r\n').filter(Boolean).slice(1);
    const expected = rows.filter((r) => r.status === 'failed' && r.purpose === 'renewal').map((r) => r.id).sort();
    expect(filtered.map((l) => l.split(',')[0]).sort()).toEqual(expected);
    expect(expected.length).toBeGreaterThan(0);
  });
});
