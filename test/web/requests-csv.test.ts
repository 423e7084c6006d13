import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { csvCell } from '../../src/web/dashboard/requests.ts';
import { useTestApp } from '../helpers/app.ts';

const EMAIL = 'csv@example.com';
const PASSWORD = 'a long enough password';

const FORMULAS = ['=1+1', '+1+1', '-1+1', '-2+3*cmd|"/C calc"!A0', '@SUM(A1)', '\t=1', '\r=1', '-', '--1'];

describe('the requests CSV export', () => {
  const t = useTestApp('sqlite');
  let listening: Promise<string> | undefined;
  const baseUrl = () => (listening ??= t.listen());

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
    const session = await signIn(await baseUrl(), EMAIL);
    const csv = await fetch(`${session.base}/dashboard/requests.csv`, { headers: { cookie: session.cookie } });
    expect(csv.status).toBe(200);
    const rows = (await csv.text()).trim().split('\n').slice(1);
    expect(rows).toHaveLength(3);
    for (const row of rows) expect(row).toMatch(/^"?'(-1\+1|@SUM\(A1\)|=HYPERLINK\(""x""\))/);
  });

  it('streams every matching record, past 10,000, with a column for each metadata key', async () => {
    const email = 'many@example.com';
    const { secretKey } = await createMerchant(t.storage, { name: 'Many', email, password: PASSWORD }, new Date().toISOString());
    const customer = await t.customerWithMeter({ credit: '5', secretKey });
    const recorded = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(secretKey),
      payload: { request_id: 'seed', customer_id: customer.customerId, meter_slug: customer.meterSlug, input_tokens: 7, metadata: { team: 'search', env: '=1+1' } },
    });
    expect(recorded.statusCode, recorded.body).toBe(201);
    await t.settledRecord('seed', t.auth(secretKey));
    // 10,050 more records like it, written straight into the table (the API would take minutes).
    const copies = 10_050;
    const columns = (await sql<{ name: string }>`pragma table_info(requests)`.execute(t.storage.db)).rows.map((r) => r.name);
    const selected = columns.map((c) =>
      c === 'id' ? sql`requests.id || '-' || printf('%05d', n.i)` : c === 'request_id' ? sql`'copy-' || n.i` : sql.ref(`requests.${c}`),
    );
    await sql`insert into requests (${sql.join(columns.map((c) => sql.ref(c)))})
      with recursive n(i) as (select 1 union all select i + 1 from n where i < ${copies})
      select ${sql.join(selected)} from requests, n where requests.request_id = 'seed'`.execute(t.storage.db);

    const session = await signIn(await baseUrl(), email);
    const csv = await fetch(`${session.base}/dashboard/requests.csv`, { headers: { cookie: session.cookie } });
    expect(csv.status).toBe(200);
    expect(csv.headers.get('content-length')).toBeNull();
    const lines = (await csv.text()).split('\r\n').filter(Boolean);
    expect(lines[0]).toBe(`request_id,status,customer_id,meter_id,provider,model,input_tokens,output_tokens,base_cost,fee,service_charge,total_request_cost,created_at,metadata.env,metadata.team`);
    expect(lines).toHaveLength(1 + copies + 1);
    const seed = lines.find((l) => l.startsWith('seed,'))!;
    expect(seed.endsWith(`,'=1+1,search`)).toBe(true);
    expect(new Set(lines.slice(1).map((l) => l.split(',')[0])).size).toBe(copies + 1);
  });
});

/** A dashboard session over real HTTP: the cookie a signed-in browser would send. */
async function signIn(base: string, email: string): Promise<{ base: string; cookie: string }> {
  const page = await fetch(`${base}/dashboard/sign-in`);
  const csrf = /name="_csrf" value="([^"]+)"/.exec(await page.text())![1]!;
  const cookie = page.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
  const signedIn = await fetch(`${base}/dashboard/sign-in`, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', cookie },
    body: new URLSearchParams({ _csrf: csrf, email, password: PASSWORD }).toString(),
  });
  expect(signedIn.status).toBe(303);
  return { base, cookie: [cookie, ...signedIn.headers.getSetCookie().map((c) => c.split(';')[0])].join('; ') };
}
