import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CallJournal, readSegmentLines, segmentsIn } from '../../src/ledger/journal/journal.ts';
import { admittedLine, callsOf, finishedLine, type AdmittedCall } from '../../src/ledger/journal/calls.ts';
import type { BillingContext } from '../../src/ledger/billing.ts';
import type { MeterRow } from '../../src/storage/meters.ts';
import { runTempDir } from '../helpers/databases.ts';

const segments = (dir: string) => readdirSync(dir).filter((name) => name.endsWith('.calls'));

describe('call journal segments', () => {
  it('keeps a segment while a call in it is not done, and deletes it once all are done and a newer one is written', () => {
    const dir = runTempDir();
    const journal = new CallJournal(dir, { segmentBytes: 100 });
    const a = journal.admitted('request_a', 'x'.repeat(120));
    // Past 100 bytes: the next entry starts a second segment.
    const b = journal.admitted('request_b', 'y'.repeat(20));
    journal.finished(a, 'a finished');
    expect(segments(dir)).toHaveLength(2);
    journal.done(b);
    // b's segment is the one being written: kept.
    expect(segments(dir)).toHaveLength(2);
    journal.done(a);
    // a's first segment had nothing else open: deleted; its outcome line was in b's segment.
    expect(segments(dir)).toHaveLength(1);
    expect(readSegmentLines(segmentsIn(dir))).toEqual(['y'.repeat(20), 'a finished']);
    journal.close();
    expect(existsSync(dir)).toBe(false);
  });

  it('keeps, at close, the segments of calls not done, and the next journal in the directory finds them', () => {
    const dir = runTempDir();
    const journal = new CallJournal(dir);
    journal.admitted('request_a', 'left');
    journal.close();
    const next = new CallJournal(dir);
    expect(readSegmentLines(next.leftover)).toEqual(['left']);
    next.discard(next.leftover);
    next.close();
    expect(existsSync(dir)).toBe(false);
  });

  it("names segments by the journal's clock, and a clock that stands still never makes a new journal write into a leftover segment", () => {
    const dir = runTempDir();
    const clock = { now: () => 1_000_000 };
    const journal = new CallJournal(dir, { clock });
    journal.admitted('request_a', 'left');
    journal.close();
    // Same process, same clock reading, same first sequence number: the same name would come next.
    const next = new CallJournal(dir, { clock });
    expect(segments(dir).every((name) => name.startsWith((1_000_000).toString(36).padStart(10, '0')))).toBe(true);
    const b = next.admitted('request_b', 'new');
    expect(readSegmentLines(next.leftover)).toEqual(['left']);
    next.discard(next.leftover);
    expect(readSegmentLines(segmentsIn(dir))).toEqual(['new']);
    next.done(b);
    next.close();
    expect(existsSync(dir)).toBe(false);
  });

  it('refuses a directory another live process journals in, and takes over one whose process is gone', () => {
    const dir = runTempDir();
    writeFileSync(join(dir, 'lock'), String(process.ppid));
    expect(() => new CallJournal(dir)).toThrow(/in use by process/);
    const gone = spawnSync('node', ['-e', 'process.stdout.write(String(process.pid))']).stdout.toString();
    writeFileSync(join(dir, 'lock'), gone);
    const journal = new CallJournal(dir);
    expect(() => new CallJournal(dir)).toThrow(/in use by process/);
    journal.close();
  });

  it('a lock naming this very process is stale when this process did not open the journal (a container restarted with the same pid)', () => {
    const dir = runTempDir();
    writeFileSync(join(dir, 'lock'), String(process.pid));
    const journal = new CallJournal(dir);
    journal.close();
  });
});

describe('call journal entries', () => {
  const billing: BillingContext = {
    merchantId: 'merchant_1',
    merchantWalletId: 'wallet_m',
    secretKeyId: 'key_1',
    mode: 'customer',
    connection: { id: 'conn_1', wallet_id: 'wallet_c' },
    meter: null,
    providerKey: 'sk-callers-own-provider-key',
    providerKeyType: 'unmanaged',
    payer: 'customer',
    serviceChargeRate: null,
  };
  const call = (wallet: bigint, merchant: bigint, rate: bigint): AdmittedCall => ({
    id: 'request_1',
    admittedAt: '2026-11-28T00:00:00.000Z',
    ttlMs: 1000,
    walletId: 'wallet_c',
    estimate: { wallet, merchant },
    record: { provider: 'openai', model: null, endpoint: 'POST x', provider_key_type: 'unmanaged', metadata: { $bigint: 'not money' } },
    billing,
    prices: { input: wallet, output: merchant },
    baseCostCharged: false,
    serviceChargeRate: rate,
  });

  it('keeps money exact through a line and back', () => {
    const units = fc.bigInt({ min: -(2n ** 80n), max: 2n ** 80n });
    fc.assert(
      fc.property(units, units, units, (wallet, merchant, rate) => {
        const back = callsOf([admittedLine(call(wallet, merchant, rate))]).get('request_1')!.admitted!;
        expect(back.estimate).toEqual({ wallet, merchant });
        expect(back.prices).toEqual({ input: wallet, output: merchant });
        expect(back.serviceChargeRate).toBe(rate);
        // A metadata value that looks like the tag but is not one stays as it was.
        expect(back.record.metadata).toEqual({ $bigint: 'not money' });
      }),
    );
  });

  it("never writes the caller's own provider key nor the meter's secret, and the meter's pricing comes back", () => {
    const meter: MeterRow = {
      id: 'meter_1',
      merchant_id: 'merchant_1',
      slug: 'chat',
      name: 'Chat',
      secret: 'mets_the-meters-own-secret',
      rate_type: 'fixed',
      tier_type: 'tokens_1m',
      token_basis: 'input+output',
      base_cost_payer: 'wallet',
      service_charge_payer: 'wallet',
      tiers: '[{"start":0,"rate":"1.0000000000"}]',
      created_at: '2026-11-28T00:00:00.000Z',
      deleted_at: null,
    };
    const line = admittedLine({ ...call(1n, 0n, 0n), billing: { ...billing, meter } });
    expect(line).not.toContain('sk-callers-own-provider-key');
    expect(line).not.toContain('mets_the-meters-own-secret');
    expect(callsOf([line]).get('request_1')!.admitted!.billing.meter).toEqual({ ...meter, secret: '' });
  });

  it('joins a call admission and outcome, and skips a line cut short', () => {
    const lines = [admittedLine(call(1n, 2n, 3n)), finishedLine({ id: 'request_1', at: 'now', usage: null }), '{"k":"a","billing":{"merch'];
    const calls = callsOf(lines);
    expect([...calls.keys()]).toEqual(['request_1']);
    expect(calls.get('request_1')!.finished).toEqual({ id: 'request_1', at: 'now', usage: null });
  });
});
