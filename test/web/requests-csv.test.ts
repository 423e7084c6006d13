import { describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { csvCell } from '../../src/web/dashboard/requests.ts';
import { useTestApp } from '../helpers/app.ts';

const EMAIL = 'csv@example.com';
const PASSWORD = 'a long enough password';

const FORMULAS = ['=1+1', '+1+1', '-1+1', '-2+3*cmd|"/C calc"!A0', '@SUM(A1)', '\t=1', '\r=1', '-', '--1'];

describe('the requests CSV export', () => {
  const t = useTestApp('sqlite');

  it('prefixes every cell a spreadsheet would run as a formula, and leaves plain numbers alone', () => {
    for (const cell of FORMULAS) expect(csvCell(cell).replace(/^"/, ''), JSON.stringify(cell)).toMatch(/^'/);
    for (const number of ['-1', '-0.5000000000', '12', '0.0000000000']) expect(csvCell(number)).toBe(number);
    expect(csvCell('a,"b"')).toBe('"a,""b"""');
  });

  it('exports request ids that look like formulas as text', async () => {
    const { secretKey } = await createMerchant(t.storage, { name: 'CSV', email: EMAIL, password: PASSWORD }, new Date().toISOString());
    const customer = await t.customerWithMeter({ credit: '5', secretKey });
    for (const [i, id] of ['-1+1', '@SUM(A1)', '=HYPERLINK("x")'].entries()) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/v1/requests',
        headers: t.auth(secretKey),
        payload: { request_id: id, customer_id: customer.customerId, meter_slug: customer.meterSlug, input_tokens: i },
      });
      expect(res.statusCode, res.body).toBe(201);
    }
    const base = await t.listen();
    const page = await fetch(`${base}/dashboard/sign-in`);
    const csrf = /name="_csrf" value="([^"]+)"/.exec(await page.text())![1]!;
    const cookie = page.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
    const signedIn = await fetch(`${base}/dashboard/sign-in`, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded', cookie },
      body: new URLSearchParams({ _csrf: csrf, email: EMAIL, password: PASSWORD }).toString(),
    });
    expect(signedIn.status).toBe(303);
    const session = [cookie, ...signedIn.headers.getSetCookie().map((c) => c.split(';')[0])].join('; ');
    const csv = await fetch(`${base}/dashboard/requests.csv`, { headers: { cookie: session } });
    expect(csv.status).toBe(200);
    const rows = (await csv.text()).trim().split('\n').slice(1);
    expect(rows).toHaveLength(3);
    for (const row of rows) expect(row).toMatch(/^"?'(-1\+1|@SUM\(A1\)|=HYPERLINK\(""x""\))/);
  });
});
