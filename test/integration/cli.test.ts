import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { findWallet } from '../../src/ledger/wallets.ts';
import { openStorage } from '../../src/storage/db.ts';
import { startTestApp } from '../helpers/app.ts';
import { tollgate } from '../helpers/cli.ts';
import { databasesUnderTest, freshDatabase } from '../helpers/databases.ts';

describe('tollgate CLI', () => {
  it('prints help naming every command', async () => {
    const { code, stdout } = await tollgate(['--help']);
    expect(code).toBe(0);
    for (const cmd of ['serve', 'migrate', 'admin']) expect(stdout).toContain(cmd);
    const admin = await tollgate(['admin', '--help']);
    expect(admin.stdout).toContain('create-merchant');
    expect(admin.stdout).toContain('credit-wallet');
  });

  it('refuses to start with invalid configuration and names the variable', async () => {
    const { code, stderr } = await tollgate(['serve'], { PORT: 'eighty' });
    expect(code).not.toBe(0);
    expect(stderr).toContain('PORT');
  });

  it('refuses half a login, both --rate and --default, and an unknown merchant, with a message each', async () => {
    const { url } = await freshDatabase('sqlite');
    const env = { DATABASE_URL: url };
    const [halfLogin, both, unknown] = await Promise.all([
      tollgate(['admin', 'create-merchant', '--name', 'No password', '--email', 'x@acme.example'], env),
      tollgate(['admin', 'set-service-charge', '--merchant', 'mer_x', '--rate', '1', '--default'], env),
      tollgate(['admin', 'set-service-charge', '--merchant', 'mer_nope', '--rate', '1'], env),
    ]);
    expect(halfLogin.code).not.toBe(0);
    expect(halfLogin.stderr.trim()).toBe('Give --email and --password together, or neither.');
    expect(both.code).not.toBe(0);
    expect(both.stderr.trim()).toBe('Give exactly one of --rate or --default.');
    expect(unknown.code).not.toBe(0);
    expect(unknown.stderr.trim()).toBe('No merchant with id mer_nope.');
  });

  it('create-merchant takes the login emails the HTML standard does (IDN domains too) and refuses others', async () => {
    const { url } = await freshDatabase('sqlite');
    const env = { DATABASE_URL: url };
    const login = (email: string) => ['admin', 'create-merchant', '--name', 'Mail', '--email', email, '--password', 'correct horse battery', '--json'];
    const [short, idn, bad] = await Promise.all([tollgate(login('a@b.c'), env), tollgate(login('ops@bücher.example'), env), tollgate(login('ops at example.com'), env)]);
    expect(short.code, short.stderr).toBe(0);
    expect(idn.code, idn.stderr).toBe(0);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr.trim()).toBe('ops at example.com is not a valid email address.');
    const storage = openStorage(url);
    try {
      const emails = (await storage.db.selectFrom('merchants').select('email').where('email', 'is not', null).execute()).map((m) => m.email);
      expect(emails.sort()).toEqual(['a@b.c', 'ops@bücher.example']);
    } finally {
      await storage.close();
    }
  });

  describe.each(databasesUnderTest())('on %s', (dialect) => {
    it('creates a merchant, credits its wallet exactly, and acts on the database DATABASE_URL names', async () => {
      const { url } = await freshDatabase(dialect);
      const created = await tollgate(['admin', 'create-merchant', '--name', 'Acme', '--json'], { DATABASE_URL: url });
      expect(created.code).toBe(0);
      const out = JSON.parse(created.stdout) as { merchant_id: string; secret_key: string; wallet_id: string };
      expect(out.merchant_id).toMatch(/^mer_/);
      expect(out.secret_key).toMatch(/^sk_live_/);
      expect(out.wallet_id).toMatch(/^wal_/);

      const credit = await tollgate(['admin', 'credit-wallet', '--wallet', out.wallet_id, '--amount', '12.3456789012'], {
        DATABASE_URL: url,
      });
      expect(credit.code).toBe(0);
      expect(credit.stdout).toContain('12.3456789012');

      const storage = openStorage(url);
      try {
        expect((await findWallet(storage, out.wallet_id))?.balance).toBe(parseMoney('12.3456789012'));
      } finally {
        await storage.close();
      }
    });

    it('rejects an over-precise or negative credit and an unknown wallet', async () => {
      const { url } = await freshDatabase(dialect);
      const env = { DATABASE_URL: url };
      const precise = await tollgate(['admin', 'credit-wallet', '--wallet', 'wal_x', '--amount', '0.00000000001'], env);
      expect(precise.code).not.toBe(0);
      expect(precise.stderr).toContain('10 fractional digits');
      const negative = await tollgate(['admin', 'credit-wallet', '--wallet', 'wal_x', '--amount', '-1'], env);
      expect(negative.code).not.toBe(0);
      const unknown = await tollgate(['admin', 'credit-wallet', '--wallet', 'wal_nope', '--amount', '1'], env);
      expect(unknown.code).not.toBe(0);
      expect(unknown.stderr).toContain('wal_nope');
    });

    it('creates a merchant with a dashboard login, and refuses a second one with the same email in any case clearly', async () => {
      const { url } = await freshDatabase(dialect);
      const env = { DATABASE_URL: url };
      const login = ['--email', 'ops@acme.example', '--password', 'correct horse battery'];
      const created = await tollgate(['admin', 'create-merchant', '--name', 'Acme', ...login, '--json'], env);
      expect(created.code, created.stderr).toBe(0);
      const { merchant_id } = JSON.parse(created.stdout) as { merchant_id: string };

      const sameInOtherCase = ['--email', ' Ops@ACME.example', '--password', 'another password'];
      const duplicate = await tollgate(['admin', 'create-merchant', '--name', 'Acme again', ...sameInOtherCase, '--json'], env);
      expect(duplicate.code).not.toBe(0);
      expect(duplicate.stdout).toBe('');
      expect(duplicate.stderr.trim()).toBe('A merchant with the email ops@acme.example already exists.');


      const storage = openStorage(url);
      try {
        const rows = await storage.db.selectFrom('merchants').select(['id', 'email', 'password_hash']).execute();
        expect(rows).toHaveLength(1);
        expect(rows[0]).toMatchObject({ id: merchant_id, email: 'ops@acme.example' });
        // Stored as a salted hash, never as given.
        expect(rows[0]!.password_hash).toMatch(/^scrypt\$/);
        expect(rows[0]!.password_hash).not.toContain('correct horse');
      } finally {
        await storage.close();
      }
    });

    it("sets a merchant's service charge, and --default returns it to SERVICE_CHARGE_RATE, as POST /v1/requests then charges", async () => {
      const database = await freshDatabase(dialect);
      const env = { DATABASE_URL: database.url };
      const { merchant_id, secret_key } = JSON.parse(
        (await tollgate(['admin', 'create-merchant', '--name', 'Acme', '--json'], env)).stdout,
      ) as { merchant_id: string; secret_key: string };
      const set = await tollgate(['admin', 'set-service-charge', '--merchant', merchant_id, '--rate', '10'], env);
      expect(set.code, set.stderr).toBe(0);
      expect(set.stdout).toContain('10.0000000000 %');

      const t = await startTestApp(dialect, { database, env: { SERVICE_CHARGE_RATE: '2' } });
      try {
        const h = t.auth(secret_key);
        const { customerId, meterSlug } = await t.customerWithMeter({ secretKey: secret_key, credit: '10' });
        const record = async (request_id: string) => {
          const res = await t.app.inject({
            method: 'POST',
            url: '/v1/requests',
            headers: h,
            payload: { request_id, customer_id: customerId, meter_slug: meterSlug },
          });
          expect(res.statusCode).toBe(201);
          return res.json().service_charge.amount as string;
        };
        expect(await record('with-override')).toBe('0.0250000000');

        const reset = await tollgate(['admin', 'set-service-charge', '--merchant', merchant_id, '--default'], env);
        expect(reset.code, reset.stderr).toBe(0);
        expect(await record('operator-default')).toBe('0.0050000000');
      } finally {
        await t.close();
      }
    });

    it('migrates safely when several processes start at once', async () => {
      const { url } = await freshDatabase(dialect);
      const results = await Promise.all([1, 2, 3].map(() => tollgate(['migrate'], { DATABASE_URL: url })));
      for (const r of results) expect(r.code, r.stderr).toBe(0);
      expect(results.filter((r) => r.stdout.includes('Applied')).length).toBe(1);
    });
  });
});
