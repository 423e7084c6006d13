import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { startServer } from '../../src/main.ts';
import { openStorage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { admissionOf } from '../helpers/settle.ts';
import { runTempDir } from '../helpers/databases.ts';

/**
 * Crash recovery on an embedded database (decision 0019): the one serving process died with a
 * forwarded request admitted and not settled. The next `serve` recovers it before serving: its
 * provider call may have been answered, so it is charged the estimate its hold was placed for,
 * flagged estimated, rather than made free.
 */
describe('crash recovery at start on sqlite', () => {
  it('charges a request the previous process left pending its hold estimate, once, before serving', async () => {
    const dir = runTempDir();
    const databaseUrl = `sqlite:${join(dir, 'recovery.db')}`;
    const config = loadConfig({ PORT: '0', DATABASE_URL: databaseUrl, LOG_LEVEL: 'silent' });

    // The previous process: a request admitted (hold and pending record written), then SIGKILL.
    const storage = openStorage(databaseUrl);
    await migrateToLatest(storage);
    const { merchant, secretKey } = await createMerchant(storage, { name: 'Recovery' }, new Date().toISOString());
    await creditWallet(storage, merchant.wallet_id, parseMoney('5'), new Date().toISOString());
    const billing = await resolveForwardCredential(storage, secretKey, new Date());
    const body = { model: 'gpt-4o', max_tokens: 200, messages: [{ role: 'user', content: 'the answer may have reached the client' }] };
    const estimate = estimateHold({
      requestBody: body,
      pricing: pricingFor(billing).pricing,
      prices: lookupBasePrices('openai', 'gpt-4o'),
      baseCostCharged: true,
      serviceChargeRate: config.serviceChargeRate,
    });
    const hold = estimate.wallet + estimate.merchant;
    expect(hold).toBeGreaterThan(0n);
    const admitted = await admitRequest(storage, { ...admissionOf(billing, merchant.wallet_id, { hold: '0', ttlMs: 15 * 60_000 }), estimate });
    expect(admitted.outcome).toBe('admitted');
    const { recordId } = admitted as { recordId: string };
    await storage.close();

    const server = await startServer(config);
    const side = openStorage(databaseUrl);
    try {
      const record = await side.db.selectFrom('requests').selectAll().where('id', '=', recordId).executeTakeFirstOrThrow();
      expect(record.status).toBe('completed');
      expect(Number(record.usage_estimated)).toBe(1);
      expect(BigInt(record.total_wallet_cost) + BigInt(record.total_merchant_cost)).toBe(hold);
      const wallet = (await findWallet(side, merchant.wallet_id))!;
      expect(BigInt(wallet.balance)).toBe(parseMoney('5') - hold);
      expect(BigInt(wallet.held)).toBe(0n);
      const charges = await side.db.selectFrom('ledger_transactions').select('id').where('reference', '=', recordId).execute();
      expect(charges.length).toBe(1);
      expect((await verifyLedger(side)).problems).toEqual([]);
    } finally {
      await side.close();
      await server.stop();
    }
  });
});
