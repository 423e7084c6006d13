import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { callsOf } from '../../src/ledger/journal/calls.ts';
import { CallJournal, readSegmentLines, segmentsIn } from '../../src/ledger/journal/journal.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type CustomerWithMeter, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest, runTempDir } from '../helpers/databases.ts';
import { OPENAI_CHAT, startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * The gateway's use of the call journal (decision 0024): a call is in the journal before its
 * provider has it, with the usage it is settled for once its relay ended, and leaves it once its
 * settlement committed; a call the journal cannot take is never sent.
 */
describe.each(databasesUnderTest())('call journal in the forward path (%s)', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let customer: CustomerWithMeter;
  let journal: CallJournal;
  const dir = runTempDir();

  beforeAll(async () => {
    journal = new CallJournal(dir);
    ({ upstream, t, base } = await startGatewayOnMock(dialect, { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed-openai' }, journal }));
    customer = await t.customerWithMeter({ credit: '10' });
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  let closed = false;
  afterAll(async () => {
    if (!closed) await t?.close();
    journal?.close();
    await upstream?.close();
  });

  const call = () =>
    fetch(`${base}/v1/forward?${OPENAI_CHAT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${forwardToken(t.merchant.secretKey, customer.customerId, customer.meterSlug)}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'one two three' }], max_tokens: 4 }),
    });

  it('journals the call as admitted and the usage it is settled for', async () => {
    const res = await call();
    await res.arrayBuffer();
    const id = res.headers.get('x-tollgate-request-id')!;
    expect(res.status).toBe(200);
    const record = await t.settledRecord(id);
    const calls = callsOf(readSegmentLines(segmentsIn(dir)));
    const journalled = calls.get(id)!;
    expect(journalled.admitted).toMatchObject({ id, walletId: customer.walletId, billing: { providerKey: null, connection: { id: customer.customerId } } });
    expect(journalled.finished?.usage).toMatchObject({ usage: { inputTokens: record.model_usage.input_tokens, outputTokens: record.model_usage.output_tokens }, usageEstimated: false });
  });

  it('refuses a call the journal cannot take, without calling the provider or charging anything', async () => {
    const before = upstream.requests.length;
    const wallet = () => t.storage.db.selectFrom('wallets').select(['balance', 'held']).where('id', '=', customer.walletId).executeTakeFirstOrThrow();
    const balanceBefore = (await wallet()).balance;
    // A full or failing disk, as the process sees it.
    const broken = new CallJournal(runTempDir());
    (broken as unknown as { admitted: () => never }).admitted = () => {
      throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
    };
    t.app.gateway.journal = broken;
    try {
      const res = await call();
      expect(res.status).toBe(503);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('service_unavailable');
      const id = res.headers.get('x-tollgate-request-id')!;
      expect((await t.settledRecord(id)).status).toBe('error');
    } finally {
      t.app.gateway.journal = journal;
      broken.close();
    }
    expect(upstream.requests.length).toBe(before);
    expect(await wallet()).toMatchObject({ balance: balanceBefore, held: 0n });
  });

  it('keeps nothing once every settlement is written and the journal closed', async () => {
    await t.close();
    journal.close();
    closed = true;
    expect(existsSync(dir)).toBe(false);
  });
});
