import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { findWallet } from '../../src/ledger/wallets.ts';
import { openStorage } from '../../src/storage/db.ts';
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

    it('migrates safely when several processes start at once', async () => {
      const { url } = await freshDatabase(dialect);
      const results = await Promise.all([1, 2, 3].map(() => tollgate(['migrate'], { DATABASE_URL: url })));
      for (const r of results) expect(r.code, r.stderr).toBe(0);
      expect(results.filter((r) => r.stdout.includes('Applied')).length).toBe(1);
    });
  });
});
