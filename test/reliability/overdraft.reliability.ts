import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { pricingFor } from '../../src/ledger/billing.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { freshDatabase } from '../helpers/databases.ts';
import type { MockGateway } from '../helpers/gateway.ts';
import { printFigures, startSuiteGateway } from './harness.ts';
import { forwardToken } from '../helpers/app.ts';

/**
 * Overdraft bound (decision 0019) against a provider that reports 40 times the usage it served:
 * clients forward calls billed to customers through two instances sharing one PostgreSQL, each
 * client sticking to one customer, until every wallet refuses. Every wallet ends no lower than
 * −(F − 1) × C × its hold (F = 40, C = the clients on that wallet): once a settled charge exceeds
 * its hold, the wallet admits nothing more while requests are in flight on it.
 */

const postgres = process.env.TEST_DATABASE_URL;
const FACTOR = 40;
const CUSTOMERS = 4;
const CLIENTS_PER_CUSTOMER = 4;
const CALLS_PER_CLIENT = 25;
const GRANT = '0.05';
const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const body = { model: 'gpt-4o-mini', max_tokens: 50, messages: [{ role: 'user', content: 'how far below zero can this go' }] };

/**
 * Two instances on one fresh PostgreSQL database, each with its own mock upstream reporting FACTOR
 * times the usage it served; filled before the suite's tests run and closed after them.
 */
function overReportingPair(): MockGateway[] {
  const instances: MockGateway[] = [];
  beforeAll(async () => {
    const database = await freshDatabase('postgres');
    instances.push(await startSuiteGateway('postgres', { database }), await startSuiteGateway('postgres', { database }));
    for (const gw of instances) gw.upstream.setNext({ path: '/chat/completions', overReport: FACTOR, times: Infinity });
  });
  afterAll(async () => {
    for (const gw of instances) {
      await gw.t.close();
      await gw.upstream.close();
    }
  });
  return instances;
}

describe.runIf(postgres)('overdraft bound against a provider over-reporting 40 times, two instances on postgres', () => {
  const instances = overReportingPair();

  it('keeps every wallet above −(F − 1) × its concurrent holds', async () => {
    const [a] = instances;
    const { t } = a!;
    const secretKey = t.merchant.secretKey;
    const customers: { customerId: string; walletId: string; token: string; hold: bigint }[] = [];
    for (let i = 0; i < CUSTOMERS; i++) {
      const c = await t.customerWithMeter({ credit: GRANT, meter: { name: `o${i}`, rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '1' }] } });
      const token = forwardToken(secretKey, c.customerId, c.meterSlug);
      const billing = await resolveForwardCredential(t.storage, token, new Date());
      const estimate = estimateHold({
        requestBody: body,
        pricing: pricingFor(billing).pricing,
        prices: lookupBasePrices('openai', body.model, { overrides: t.config.priceOverrides }),
        baseCostCharged: true,
        serviceChargeRate: billing.serviceChargeRate ?? t.config.serviceChargeRate,
        defaultOutputCap: t.config.defaultMaxOutputTokens,
      });
      customers.push({ ...c, token, hold: estimate.wallet });
    }
    const figures = { forwards_200: 0, refused_402: 0, other: 0 };
    let sequence = 0;
    const client = async (customer: { token: string }) => {
      for (let i = 0; i < CALLS_PER_CLIENT; i++) {
        const gw = instances[sequence++ % 2]!;
        const res = await fetch(`${gw.base}/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${customer.token}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        await res.arrayBuffer();
        if (res.status === 200) figures.forwards_200++;
        else if (res.status === 402) figures.refused_402++;
        else figures.other++;
      }
    };
    await Promise.all(customers.flatMap((customer) => Array.from({ length: CLIENTS_PER_CUSTOMER }, () => client(customer))));
    for (const gw of instances) await gw.t.app.close();

    const ledger = await verifyLedger(t.storage);
    const wallets = await t.storage.db.selectFrom('wallets').select(['id', 'balance', 'held']).where('id', 'in', customers.map((c) => c.walletId)).execute();
    const beyond = customers.filter((c) => {
      const wallet = wallets.find((w) => w.id === c.walletId)!;
      return BigInt(wallet.balance) < -BigInt(FACTOR - 1) * BigInt(CLIENTS_PER_CUSTOMER) * c.hold;
    });
    const lowest = wallets.reduce((min, w) => (BigInt(w.balance) < min ? BigInt(w.balance) : min), 0n);
    const bound = -BigInt(FACTOR - 1) * BigInt(CLIENTS_PER_CUSTOMER) * customers[0]!.hold;
    printFigures('overdraft (provider over-reporting 40x)', {
      requests: CUSTOMERS * CLIENTS_PER_CUSTOMER * CALLS_PER_CLIENT,
      ...figures,
      hold: formatMoney(customers[0]!.hold),
      lowest_wallet: formatMoney(lowest),
      documented_bound: formatMoney(bound),
      wallets_beyond_bound: beyond.length,
      ledger_problems: ledger.problems.length,
      discrepancies: beyond.length + ledger.problems.length + figures.other,
    });
    expect(figures.forwards_200).toBeGreaterThan(0);
    expect(figures.refused_402, 'every wallet was driven until it refused').toBeGreaterThan(0);
    expect(figures.other).toBe(0);
    expect(lowest, 'some wallet was overdrawn: the bound was exercised').toBeLessThan(0n);
    expect(beyond.map((c) => c.walletId)).toEqual([]);
    expect(wallets.every((w) => BigInt(w.held) === 0n)).toBe(true);
    expect(ledger.problems).toEqual([]);
  });
});

/**
 * The same provider against a spend key's limit (decision 0019): clients spend through one
 * merchant spend key on both instances until it refuses. The key's spend ends at most
 * L + (F − 1) × C × its largest reservation (L its limit, C its clients): a request is admitted
 * only while spend + reservations + its own reservation fit in L, and once a settled charge exceeds
 * its reservation the key (and the wallet holding the same requests) admits nothing more while
 * anything is in flight on it, so only what was in flight overruns.
 */
const KEY_CLIENTS = 8;
const KEY_CALLS_PER_CLIENT = 25;
const KEY_LIMIT = '0.01';
const CHAT = '/v1/chat/completions';

describe.runIf(postgres)('spend-key limit against a provider over-reporting 40 times, two instances on postgres', () => {
  const instances = overReportingPair();

  it('keeps the spend within L + (F − 1) × C × the largest reservation', async () => {
    const { t } = instances[0]!;
    // The wallet has far more than the limit: the key's limit is what stops it.
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('100'));
    const created = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'overdraft', spend_limit: { amount: KEY_LIMIT, cycle: 'total' } } });
    expect(created.statusCode).toBe(201);
    const key = created.json() as { key: string; spend_key_id: string };
    const startedAt = new Date().toISOString();

    const figures = { forwards_200: 0, refused_402: 0, other: 0 };
    let sequence = 0;
    const client = async () => {
      for (let i = 0; i < KEY_CALLS_PER_CLIENT; i++) {
        const gw = instances[sequence++ % 2]!;
        const res = await fetch(`${gw.base}${CHAT}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        await res.arrayBuffer();
        if (res.status === 200) figures.forwards_200++;
        else if (res.status === 402) figures.refused_402++;
        else figures.other++;
      }
    };
    await Promise.all(Array.from({ length: KEY_CLIENTS }, () => client()));
    for (const gw of instances) await gw.t.app.close();

    const row = await t.storage.db.selectFrom('spend_keys').selectAll().where('id', '=', key.spend_key_id).executeTakeFirstOrThrow();
    const records = await t.storage.db.selectFrom('requests').select(['id', 'status']).where('created_at', '>=', startedAt).execute();
    const holds = records.length
      ? await t.storage.db.selectFrom('holds').select(['reference', 'amount']).where('reference', 'in', records.map((r) => r.id)).execute()
      : [];
    const largestHold = holds.reduce((max, h) => (BigInt(h.amount) > max ? BigInt(h.amount) : max), 0n);
    const limit = parseMoney(KEY_LIMIT);
    const spend = BigInt(row.current_spend);
    const bound = limit + BigInt(FACTOR - 1) * BigInt(KEY_CLIENTS) * largestHold;
    const ledger = await verifyLedger(t.storage);
    const beyond = spend > bound ? 1 : 0;
    printFigures('overdraft spend key (provider over-reporting 40x)', {
      requests: KEY_CLIENTS * KEY_CALLS_PER_CLIENT,
      ...figures,
      largest_hold: formatMoney(largestHold),
      limit: KEY_LIMIT,
      spend: formatMoney(spend),
      documented_bound: formatMoney(bound),
      keys_beyond_bound: beyond,
      ledger_problems: ledger.problems.length,
      discrepancies: beyond + ledger.problems.length + figures.other,
    });
    expect(figures.forwards_200).toBeGreaterThan(0);
    expect(figures.refused_402, 'the key was driven until it refused').toBeGreaterThan(0);
    expect(figures.other).toBe(0);
    expect(records.filter((r) => r.status === 'completed')).toHaveLength(figures.forwards_200);
    expect(largestHold).toBeGreaterThan(0n);
    expect(spend, 'the limit was passed: the bound was exercised').toBeGreaterThan(limit);
    expect(spend).toBeLessThanOrEqual(bound);
    expect(BigInt(row.reserved_spend)).toBe(0n);
    expect(BigInt(row.total_spend)).toBe(spend);
    expect(ledger.problems).toEqual([]);
  });
});
