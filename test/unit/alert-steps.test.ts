import { describe, expect, it } from 'vitest';
import { stepFor } from '../../src/services/alert-round.ts';
import type { AlertRow, SpendKeyCounters } from '../../src/storage/alerts.ts';

const NOW = new Date('2026-11-29T12:00:00.000Z');
const TODAY = '2026-11-29T00:00:00.000Z';

const rule = (over: Partial<AlertRow>): AlertRow => ({
  id: 'alr_1',
  merchant_id: 'mer_1',
  kind: 'spend_threshold',
  connection_id: null,
  spend_key_id: 'spk_1',
  threshold: 100n,
  period: 'day',
  enabled: 1,
  fired_at: null,
  fired_period: null,
  baseline_period: null,
  baseline_spend: null,
  revision: 0,
  created_at: TODAY,
  updated_at: TODAY,
  ...over,
});
const readingsOf = (key: Partial<SpendKeyCounters>) => ({
  balances: new Map<string, bigint>(),
  customerSpend: new Map(),
  keys: new Map([['spk_1', { id: 'spk_1', spend_limit_cycle: null, spend_cycle_start: '1970-01-01T00:00:00.000Z', current_spend: 0n, total_spend: 0n, ...key }]]),
});

describe("a spend key's spend in a period", () => {
  it("reads the key's own counter when its limit runs over the rule's period, and an older cycle's counter as 0", () => {
    expect(stepFor(rule({}), readingsOf({ spend_limit_cycle: 'daily', spend_cycle_start: TODAY, current_spend: 150n, total_spend: 900n }), NOW)).toEqual({
      do: 'fire',
      value: 150n,
      periodStart: TODAY,
    });
    expect(stepFor(rule({}), readingsOf({ spend_limit_cycle: 'daily', spend_cycle_start: '2026-11-28T00:00:00.000Z', current_spend: 150n }), NOW)).toEqual({ do: 'nothing' });
  });

  it('takes a baseline the first time it sees a period, then counts the lifetime spend above it', () => {
    expect(stepFor(rule({}), readingsOf({ total_spend: 900n }), NOW)).toEqual({ do: 'baseline', periodStart: TODAY, spend: 900n });
    const based = rule({ baseline_period: TODAY, baseline_spend: 900n });
    expect(stepFor(based, readingsOf({ total_spend: 999n }), NOW)).toEqual({ do: 'nothing' });
    expect(stepFor(based, readingsOf({ total_spend: 1000n }), NOW)).toEqual({ do: 'fire', value: 100n, periodStart: TODAY });
    // Yesterday's baseline is replaced, not counted from.
    expect(stepFor(rule({ baseline_period: '2026-11-28T00:00:00.000Z', baseline_spend: 0n }), readingsOf({ total_spend: 5000n }), NOW)).toEqual({
      do: 'baseline',
      periodStart: TODAY,
      spend: 5000n,
    });
  });

  it('does not fire again in the period it fired in', () => {
    expect(stepFor(rule({ period: 'total', fired_at: TODAY, fired_period: '1970-01-01T00:00:00.000Z' }), readingsOf({ total_spend: 5000n }), NOW)).toEqual({ do: 'nothing' });
  });
});
