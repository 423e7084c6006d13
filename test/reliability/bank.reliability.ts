import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { freshDatabase } from '../helpers/databases.ts';
import type { MockGateway } from '../helpers/gateway.ts';
import { leaksInSuiteLogs, printFigures, startSuiteGateway } from './harness.ts';
import { forwardToken } from '../helpers/app.ts';

/**
 * Bank test: many clients against two instances sharing one PostgreSQL, granting credit,
 * recording usage (POST /v1/requests) and forwarding provider calls billed to customers. At the
 * end the ledger verifies, the customers' wallets hold exactly what was granted minus what their
 * records charged, and every 2xx has exactly one record.
 * The provider here reports what it served, so holds are upper bounds and no wallet ends below
 * zero: the documented overdraft bound with F = 1 (decision 0019; overdraft.reliability.ts holds
 * it against a provider over-reporting 40 times).
 */

const postgres = process.env.TEST_DATABASE_URL;
const CLIENTS = 24;
const CALLS_PER_CLIENT = 40;
const CUSTOMERS = 12;
const INITIAL_GRANT = '0.2';
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';

type Customer = { customerId: string; walletId: string; meterSlug: string };

describe.runIf(postgres)('bank test on two instances sharing postgres', () => {
  let instances: MockGateway[];

  beforeAll(async () => {
    const database = await freshDatabase('postgres');
    instances = [await startSuiteGateway('postgres', { database }), await startSuiteGateway('postgres', { database })];
  });
  afterAll(async () => {
    for (const gw of instances ?? []) {
      await gw.t.close();
      await gw.upstream.close();
    }
  });

  it('keeps every wallet equal to grants minus charges, with one record per 2xx', async () => {
    const [a] = instances;
    const secretKey = a!.t.merchant.secretKey;
    const auth = { authorization: `Bearer ${secretKey}` };
    const customers: Customer[] = [];
    for (let i = 0; i < CUSTOMERS; i++) {
      const c = await a!.t.customerWithMeter({ credit: INITIAL_GRANT, meter: { name: `m${i}`, rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.013' }] } });
      customers.push({ customerId: c.customerId, walletId: c.walletId, meterSlug: c.meterSlug });
    }

    // Every customer starts with a grant, so calls are admitted from the start.
    let granted = parseMoney(INITIAL_GRANT) * BigInt(CUSTOMERS);
    const figures = { grants: 0, records_201: 0, forwards_200: 0, refused_402: 0, other: 0 };
    const recorded: string[] = [];
    const forwarded: string[] = [];
    const unexpected: string[] = [];
    let sequence = 0;

    const oneCall = async (client: number) => {
      const n = sequence++;
      const gw = instances[n % 2]!;
      const customer = customers[(n * 7 + client) % CUSTOMERS]!;
      const kind = n % 5;
      if (kind === 0) {
        const amount = '0.0500000000';
        const res = await fetch(`${gw.base}/v1/customers/${customer.customerId}/credits`, {
          method: 'POST',
          headers: { ...auth, 'content-type': 'application/json' },
          body: JSON.stringify({ amount }),
        });
        if (res.status === 201) {
          granted += parseMoney(amount);
          figures.grants++;
        } else unexpected.push(`credit ${res.status} ${await res.text()}`);
        await res.body?.cancel().catch(() => undefined);
        return;
      }
      if (kind <= 2) {
        const requestId = `bank-${n}`;
        const res = await fetch(`${gw.base}/v1/requests`, {
          method: 'POST',
          headers: { ...auth, 'content-type': 'application/json' },
          body: JSON.stringify({ request_id: requestId, customer_id: customer.customerId, meter_slug: customer.meterSlug }),
        });
        if (res.status === 201) {
          recorded.push(requestId);
          figures.records_201++;
        } else if (res.status === 402) figures.refused_402++;
        else unexpected.push(`record ${res.status} ${await res.text()}`);
        await res.body?.cancel().catch(() => undefined);
        return;
      }
      const token = forwardToken(secretKey, customer.customerId, customer.meterSlug);
      const res = await fetch(`${gw.base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: `call ${n}` }], max_tokens: 5 }),
      });
      await res.arrayBuffer();
      if (res.status === 200) {
        forwarded.push(res.headers.get('x-tollgate-request-id') ?? 'missing');
        figures.forwards_200++;
      } else if (res.status === 402) figures.refused_402++;
      else unexpected.push(`forward ${res.status}`);
    };

    await Promise.all(
      Array.from({ length: CLIENTS }, async (_, client) => {
        for (let i = 0; i < CALLS_PER_CLIENT; i++) await oneCall(client);
      }),
    );
    // Both instances drain their settlements on close.
    for (const gw of instances) await gw.t.app.close();

    const { storage } = a!.t;
    const ledger = await verifyLedger(storage);
    const walletIds = customers.map((c) => c.walletId);
    const wallets = await storage.db.selectFrom('wallets').select(['id', 'balance']).where('id', 'in', walletIds).execute();
    const balances = wallets.reduce((sum, w) => sum + BigInt(w.balance), 0n);
    const records = await storage.db
      .selectFrom('requests')
      .select(['id', 'request_id', 'status', 'total_wallet_cost'])
      .where('connection_id', 'in', customers.map((c) => c.customerId))
      .execute();
    const charged = records.filter((r) => r.status === 'completed').reduce((sum, r) => sum + BigInt(r.total_wallet_cost), 0n);
    const byRequestId = new Map<string, number>();
    const byId = new Map<string, string>();
    for (const r of records) {
      byRequestId.set(r.request_id, (byRequestId.get(r.request_id) ?? 0) + 1);
      byId.set(r.id, r.status);
    }
    const unmatchedRecords = recorded.filter((id) => byRequestId.get(id) !== 1).length;
    const unmatchedForwards = forwarded.filter((id) => byId.get(id) !== 'completed').length;
    const lowest = wallets.reduce((min, w) => (BigInt(w.balance) < min ? BigInt(w.balance) : min), BigInt(wallets[0]!.balance));
    const belowBound = wallets.filter((w) => BigInt(w.balance) < 0n).length;
    const discrepancies =
      ledger.problems.length + (balances === granted - charged ? 0 : 1) + unmatchedRecords + unmatchedForwards + unexpected.length + belowBound;
    printFigures('bank', {
      instances: instances.length,
      clients: CLIENTS,
      requests: CLIENTS * CALLS_PER_CLIENT,
      ...figures,
      granted: formatMoney(granted),
      charged: formatMoney(charged),
      wallets_sum: formatMoney(balances),
      lowest_wallet: formatMoney(lowest),
      wallets_below_bound: belowBound,
      unmatched_2xx: unmatchedRecords + unmatchedForwards,
      ledger_problems: ledger.problems.length,
      discrepancies,
    });
    expect(unexpected).toEqual([]);
    expect(figures.forwards_200).toBeGreaterThan(0);
    expect(figures.records_201).toBeGreaterThan(0);
    expect(ledger.problems).toEqual([]);
    expect(balances).toBe(granted - charged);
    expect(unmatchedRecords + unmatchedForwards).toBe(0);
    expect(lowest, 'no wallet below its documented bound (0 with an honest provider)').toBeGreaterThanOrEqual(0n);
    expect(discrepancies).toBe(0);
  });

  it('logged no secret, key or e-mail address', () => {
    expect(leaksInSuiteLogs().leaks).toEqual([]);
  });
});
