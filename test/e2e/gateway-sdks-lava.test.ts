import { describe, expect, it } from 'vitest';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { normalise, useSdkGateway } from '../helpers/sdk-gateway.ts';

/**
 * The published Lava client (@lavapayments/nodejs) drives the forward gateway over real HTTP (see
 * sdk-gateway.ts for the billing modes and the hand-worked costs): gateway() with customer
 * billing, meter-only, disable_billing and a caller's own provider key, and `providers.openai`
 * with a path and plain fetch; the ledger is left balanced.
 */

describe.each(databasesUnderTest())('official SDKs through the forward gateway on %s', (dialect) => {
  const h = useSdkGateway(dialect);
  const { t, lava, meter, customer, customerToken, balances, newestRecordId, direct, lastUpstream, expectBilled, expectNoTollgateCredential } = h;

  describe('@lavapayments/nodejs client', () => {
    type Chat = { id: string; usage: { prompt_tokens: number; completion_tokens: number }; choices: { message: { content: string } }[] };
    const chatBody = (content: string, maxTokens: number) => ({ model: 'gpt-4o', messages: [{ role: 'user', content }], max_tokens: maxTokens });

    it('gateway() with customer billing: the exact answer; customer pays fee + base', async () => {
      const before = await balances();
      const data = await lava.gateway<Chat>('https://api.openai.com/v1/chat/completions', {
        customer_id: customer.customer_id,
        meter_slug: meter.meter_slug,
        body: chatBody('via the lava client', 5),
      });
      const seen = lastUpstream();
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expect(seen.body.toString()).toBe(JSON.stringify(chatBody('via the lava client', 5)));
      expectNoTollgateCredential(seen);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(await newestRecordId(), before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 5,
        customerId: customer.customer_id,
        meterId: meter.meter_id,
        // base 4/1M + 10/1M = 0.000014; fee 9 × 100/1M = 0.0009
        totalRequestCost: '0.0009140000',
      });
    });

    it('gateway() meter-only: priced by the meter, the merchant wallet pays', async () => {
      const before = await balances();
      const data = await lava.gateway<Chat>('https://api.openai.com/v1/chat/completions', {
        meter_slug: meter.meter_slug,
        body: chatBody('meter only', 4),
      });
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(lastUpstream())).text)));
      await expectBilled(await newestRecordId(), before, {
        billing: 'meter_only',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 2,
        outputTokens: 4,
        customerId: null,
        meterId: meter.meter_id,
        // base 2/1M + 8/1M = 0.00001; fee 6 × 100/1M = 0.0006
        totalRequestCost: '0.0006100000',
      });
    });

    it('gateway() with disable_billing: recorded for the customer, whose wallet is untouched', async () => {
      const before = await balances();
      const data = await lava.gateway<Chat>('https://api.openai.com/v1/chat/completions', {
        customer_id: customer.customer_id,
        meter_slug: meter.meter_slug,
        disable_billing: true,
        body: chatBody('free for the customer', 3),
      });
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(lastUpstream())).text)));
      const record = await expectBilled(await newestRecordId(), before, {
        billing: 'billing_disabled',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 3,
        customerId: customer.customer_id,
        meterId: meter.meter_id,
        // merchant pays the managed key's base cost 4/1M + 6/1M = 0.00001; no fee
        totalRequestCost: '0.0000100000',
      });
      expect(record.total_wallet_cost).toBe('0.0000000000');
    });

    it('gateway() merchant billing with provider_key: the caller key upstream, nothing charged', async () => {
      const before = await balances();
      const data = await lava.gateway<{ content: { text: string }[] }>('https://api.anthropic.com/v1/messages', {
        provider_key: 'sk-ant-own',
        headers: { 'anthropic-version': '2023-06-01' },
        body: { model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hello' }] },
      });
      const seen = lastUpstream();
      expect(seen.headers['x-api-key']).toBe('sk-ant-own');
      expect(seen.headers['anthropic-version']).toBe('2023-06-01');
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(await newestRecordId(), before, {
        billing: 'merchant_unmanaged',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 1,
        outputTokens: 2,
        totalRequestCost: '0.0000000000',
      });
    });

    it('providers.openai + a path, with fetch and a forward token (raw u)', async () => {
      const token = customerToken();
      const before = await balances();
      const url = `${lava.providers.openai}/chat/completions`;
      expect(url).toBe(`${h.base}/v1/forward?u=https://api.openai.com/v1/chat/completions`);
      const res = await fetch(url, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify(chatBody('raw u form', 2)),
      });
      expect(res.status).toBe(200);
      const text = await res.text();
      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/chat/completions');
      // Byte for byte, not just the same JSON.
      expect(text.replace(/mock\d+/g, 'mockN')).toBe((await direct(seen)).text.replace(/mock\d+/g, 'mockN'));
      await expectBilled(res.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 3,
        outputTokens: 2,
        // base 3/1M + 4/1M = 0.000007; fee 5 × 100/1M = 0.0005
        totalRequestCost: '0.0005070000',
      });
    });
  });

  it('leaves a balanced ledger behind', async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
