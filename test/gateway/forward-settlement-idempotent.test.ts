import { describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/ids.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { admitRequest } from '../../src/ledger/admission/admit.ts';
import { failRequest, settleRequest, type SettleInput } from '../../src/ledger/settlement/settle.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { CHAT_BODY as body, useAdmissionGateway } from '../helpers/admission-gateway.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * Settlement happens once: settling a forwarded request again, settling one admitted request
 * concurrently, or settling a failed one charges nothing more and changes no record.
 */

describe.each(databasesUnderTest())('forward gateway admission and holds on %s', (dialect) => {
  const { t, upstream, record, wallet, post, freshPayers } = useAdmissionGateway(dialect);

  describe('settlement is idempotent', () => {
    async function settleInput(credential: string, recordId: string, holdIds: string[]): Promise<SettleInput> {
      const billing = await resolveForwardCredential(t.storage, credential, new Date());
      return {
        recordId,
        holdIds,
        billing,
        now: new Date(),
        usage: { inputTokens: 100, outputTokens: 50, inputCharacters: 0, outputCharacters: 0, inputSeconds: '0', outputSeconds: '0' },
        model: 'gpt-4o',
        prices: lookupBasePrices('openai', 'gpt-4o', { overrides: t.config.priceOverrides }),
        baseCostCharged: true,
        serviceChargeRate: t.config.serviceChargeRate,
        responseId: 'chatcmpl-replayed',
        usageEstimated: false,
      };
    }
    const transactionsFor = async (reference: string) =>
      (await t.storage.db.selectFrom('ledger_transactions').select('id').where('reference', '=', reference).execute()).length;

    it('settling a forwarded request again charges nothing more', async () => {
      const { merchant, token, customerWalletId } = await freshPayers();
      await creditWallet(t.storage, customerWalletId, parseMoney('5'), new Date().toISOString());
      const res = await post(token, body);
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const recordId = res.headers.get('x-tollgate-request-id')!;
      const first = await t.settledRecord(recordId, t.auth(merchant.secretKey));
      expect(first.status).toBe('completed');
      const balance = (await wallet(customerWalletId)).balance;
      const holdIds = (await t.storage.db.selectFrom('holds').select('id').where('reference', '=', recordId).execute()).map((h) => h.id);
      // The embedded shape writes no hold row when the settlement takes its admission over (0011).
      expect(holdIds.length).toBeLessThanOrEqual(1);
      const transactions = await transactionsFor(recordId);
      expect(transactions).toBe(1);

      expect((await settleRequest(t.storage, await settleInput(token, recordId, holdIds))).outcome).toBe('duplicate');
      await failRequest(t.storage, { now: new Date(), recordId, holdIds });
      expect((await wallet(customerWalletId)).balance).toBe(balance);
      expect((await wallet(customerWalletId)).held).toBe(0n);
      expect(await transactionsFor(recordId)).toBe(1);
      const again = await record(recordId, merchant);
      expect(again).toMatchObject({ status: 'completed', total_request_cost: first.total_request_cost, model_usage: first.model_usage });
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });

    it('two concurrent settlements of one admitted request charge once', async () => {
      const { merchant } = await freshPayers();
      await creditWallet(t.storage, merchant.walletId, parseMoney('5'), new Date().toISOString());
      const billing = await resolveForwardCredential(t.storage, merchant.secretKey, new Date());
      const { walletId } = pricingFor(billing);
      const recordId = newId('request');
      const admitted = await admitRequest(t.storage, { now: new Date(),
        requestId: recordId,
        billing,
        walletId,
        estimate: { wallet: parseMoney('0.01'), merchant: 0n },
        ttlMs: 60_000,
        record: { provider: 'openai', model: 'gpt-4o', endpoint: 'POST https://api.openai.com/v1/chat/completions', provider_key_type: 'managed', metadata: {} },
      });
      expect(admitted.outcome).toBe('admitted');
      if (admitted.outcome !== 'admitted') return;
      const before = (await wallet(merchant.walletId)).balance;
      const input = await settleInput(merchant.secretKey, admitted.recordId, admitted.holdIds);
      const outcomes = await Promise.all([settleRequest(t.storage, input), settleRequest(t.storage, input), settleRequest(t.storage, input)]);
      const recorded = outcomes.filter((o) => o.outcome === 'recorded');
      expect(recorded.length).toBe(1);
      expect(outcomes.filter((o) => o.outcome === 'duplicate').length).toBe(2);
      const charged = recorded[0]!.outcome === 'recorded' ? recorded[0]!.row.total_merchant_cost + recorded[0]!.row.total_wallet_cost : 0n;
      expect(charged).toBeGreaterThan(0n);
      const after = await wallet(merchant.walletId);
      expect(after.balance).toBe(before - charged);
      expect(after.held).toBe(0n);
      expect(await transactionsFor(admitted.recordId)).toBe(1);
      expect((await record(admitted.recordId, merchant)).status).toBe('completed');
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });

    it('a failed request stays failed: a late settlement and a second failure change nothing', async () => {
      const { merchant } = await freshPayers();
      await creditWallet(t.storage, merchant.walletId, parseMoney('5'), new Date().toISOString());
      upstream.setNext({ path: '/chat/completions', status: 500 });
      const res = await post(merchant.secretKey, body);
      expect(res.status).toBe(500);
      await res.arrayBuffer();
      const recordId = res.headers.get('x-tollgate-request-id')!;
      expect((await t.settledRecord(recordId, t.auth(merchant.secretKey))).status).toBe('error');
      const before = await wallet(merchant.walletId);
      const holdIds = (await t.storage.db.selectFrom('holds').select('id').where('reference', '=', recordId).execute()).map((h) => h.id);
      expect((await settleRequest(t.storage, await settleInput(merchant.secretKey, recordId, holdIds))).outcome).toBe('duplicate');
      await failRequest(t.storage, { now: new Date(), recordId, holdIds });
      const after = await wallet(merchant.walletId);
      expect(after.balance).toBe(before.balance);
      expect(after.held).toBe(0n);
      expect((await record(recordId, merchant)).status).toBe('error');
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    });
  });
});
