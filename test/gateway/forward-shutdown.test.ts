import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { OPENAI_CHAT, startGatewayOnMock, type MockGateway } from '../helpers/gateway.ts';

/**
 * A graceful shutdown with forwarded streams in flight: one that ends within SHUTDOWN_GRACE_MS is
 * relayed whole; one still running when the grace period is over has its connection closed, so
 * the shutdown ends, and is charged for what was relayed, its hold released and the ledger intact.
 */

const CLOSE_GIVEN_UP_MS = 10_000;

/** A gateway on the mock whose merchant's wallet holds 10. */
async function gatewayWithGrace(dialect: 'sqlite' | 'postgres', graceMs: number): Promise<MockGateway> {
  const gw = await startGatewayOnMock(dialect, {
    providerHosts: ['api.openai.com'],
    providerKeys: { openai: 'sk-managed-openai' },
    env: { SHUTDOWN_GRACE_MS: String(graceMs) },
  });
  await creditWallet(gw.t.storage, gw.t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  return gw;
}

/** A streamed chat completion of `words` output words, billed to the gateway's merchant; its first chunk is read. */
async function streamStarted(gw: MockGateway, words: number) {
  const res = await fetch(`${gw.base}/v1/forward?${OPENAI_CHAT}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.t.merchant.secretKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: words, messages: [{ role: 'user', content: 'count slowly' }] }),
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value);
  /** The rest of the stream as the client receives it, and whether its connection was cut. */
  const rest = async () => {
    try {
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += decoder.decode(chunk.value);
      return { text, cut: false };
    } catch {
      return { text, cut: true };
    }
  };
  return { requestId: res.headers.get('x-tollgate-request-id')!, rest };
}

/** app.close(), or 'hung' when it has not resolved in CLOSE_GIVEN_UP_MS. */
async function closeApp(gw: MockGateway): Promise<'closed' | 'hung'> {
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<'hung'>((resolve) => (timer = setTimeout(() => resolve('hung'), CLOSE_GIVEN_UP_MS)));
  try {
    return await Promise.race([gw.t.app.close().then(() => 'closed' as const), hung]);
  } finally {
    clearTimeout(timer);
  }
}

async function closeEverything(gw: MockGateway): Promise<void> {
  await gw.t.close();
  await gw.upstream.close();
}

describe.each(databasesUnderTest())('graceful shutdown of the forward gateway on %s', (dialect) => {
  it('relays a stream that ends within the grace period whole, and charges it in full', async () => {
    const gw = await gatewayWithGrace(dialect, 10_000);
    try {
      gw.upstream.setNext({ path: '/chat/completions', chunkDelayMs: 20 });
      const stream = await streamStarted(gw, 10);
      const closing = closeApp(gw);
      const { text, cut } = await stream.rest();
      expect(await closing).toBe('closed');
      expect(cut).toBe(false);
      expect(text).toContain('[DONE]');
      const record = await gw.t.storage.db.selectFrom('requests').selectAll().where('id', '=', stream.requestId).executeTakeFirstOrThrow();
      expect(record.status).toBe('completed');
      expect(Number(record.output_tokens)).toBe(10);
      expect(Number(record.usage_estimated)).toBe(0);
    } finally {
      await closeEverything(gw);
    }
  });

  it('cuts a stream still running when the grace period is over, so the shutdown ends, and charges what was relayed', async () => {
    const gw = await gatewayWithGrace(dialect, 100);
    try {
      // 60 words 100 ms apart: six seconds of stream, far beyond the grace period.
      gw.upstream.setNext({ path: '/chat/completions', chunkDelayMs: 100 });
      const before = await findWallet(gw.t.storage, gw.t.merchant.walletId);
      const stream = await streamStarted(gw, 60);
      const closing = closeApp(gw);
      const { text, cut } = await stream.rest();
      expect(await closing).toBe('closed');
      expect(text).not.toContain('[DONE]');
      expect(cut, 'the client sees its transfer cut, not ended as if complete').toBe(true);
      const record = await gw.t.storage.db.selectFrom('requests').selectAll().where('id', '=', stream.requestId).executeTakeFirstOrThrow();
      expect(record.status).toBe('completed');
      expect(Number(record.usage_estimated)).toBe(1);
      expect(BigInt(record.total_merchant_cost)).toBeGreaterThan(0n);
      const after = await findWallet(gw.t.storage, gw.t.merchant.walletId);
      expect(after!.held).toBe(0n);
      expect(BigInt(before!.balance) - BigInt(after!.balance)).toBe(BigInt(record.total_merchant_cost));
      expect((await verifyLedger(gw.t.storage)).problems).toEqual([]);
    } finally {
      await closeEverything(gw);
    }
  });
});
