/**
 * What the call journal (decision 0024) costs a forwarded call: the same non-streaming chat through
 * a server with the journal off and one with it on, in alternating rounds on the same database, so
 * both see the same machine. Reports the added p50 at one connection (against a direct call in the
 * same round) and the gateway's CPU per request at 32 connections (settlements included), and the
 * journal's share of each; the target is within 10 % of the journal off.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Storage } from '../src/storage/db.ts';
import { forwardClient, measure, waitForSettlements, type GatewayRow } from './gateway.ts';
import { cpuMs, machineTicks, stealPercent } from './process-stats.ts';

const CONNECTIONS = 32;
const BODY = JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 8, messages: [{ role: 'user', content: 'Say something short please' }] });

type Mode = 'off' | 'on';
type Figures = { addedP50: number[]; cpuMs: number; ok: number; non2xx: number };

/** Starts a server with `env` added to the bench's, runs `work` against it, stops it. */
export type WithServer = (env: Record<string, string>, work: (server: { url: string; pid: number }) => Promise<void>) => Promise<void>;

export async function benchCallJournal(opts: { engine: string; storage: Storage; withServer: WithServer; mockUrl: string; seconds: number; rounds: number }): Promise<GatewayRow[]> {
  const figures: Record<Mode, Figures> = { off: { addedP50: [], cpuMs: 0, ok: 0, non2xx: 0 }, on: { addedP50: [], cpuMs: 0, ok: 0, non2xx: 0 } };
  const journalDir = mkdtempSync(join(tmpdir(), 'tollgate-bench-journal-'));
  const ticksBefore = machineTicks();
  for (let round = 0; round < opts.rounds; round++) {
    for (const mode of ['off', 'on'] as const) {
      await opts.withServer({ CALL_JOURNAL_DIR: mode === 'off' ? 'off' : journalDir }, async (server) => {
        const { forwardUrl, forwardHeaders, merchantId } = await forwardClient(opts.storage, server.url);
        // The JIT settles on both loads' paths before anything is measured.
        await measure(forwardUrl, forwardHeaders, BODY, CONNECTIONS, 1);
        await measure(forwardUrl, forwardHeaders, BODY, 1, 1);
        await waitForSettlements(opts.storage, merchantId);
        const half = opts.seconds / 2;
        const direct = await measure(`${opts.mockUrl}/v1/chat/completions`, { 'content-type': 'application/json', authorization: 'Bearer x' }, BODY, 1, half);
        const via = await measure(forwardUrl, forwardHeaders, BODY, 1, half);
        figures[mode].addedP50.push(via.p50 - direct.p50);
        const before = cpuMs(server.pid);
        const loaded = await measure(forwardUrl, forwardHeaders, BODY, CONNECTIONS, opts.seconds);
        await waitForSettlements(opts.storage, merchantId);
        figures[mode].cpuMs += cpuMs(server.pid) - before;
        figures[mode].ok += loaded.ok;
        figures[mode].non2xx += loaded.non2xx + via.non2xx;
      });
    }
  }
  const p50 = (mode: Mode) => median(figures[mode].addedP50);
  const cpu = (mode: Mode) => figures[mode].cpuMs / Math.max(1, figures[mode].ok);
  const share = (on: number, off: number) => `${on - off >= 0 ? '+' : ''}${(((on - off) / Math.max(off, 1e-9)) * 100).toFixed(1)} %`;
  const rows: GatewayRow[] = (['off', 'on'] as const).map((mode) => ({
    scenario: `forward non-streaming chat, call journal ${mode} (${opts.rounds} rounds)`,
    engine: opts.engine,
    result: `added p50 ${p50(mode).toFixed(3)} ms (1 connection, median of rounds); gateway CPU ${cpu(mode).toFixed(3)} ms/request (${CONNECTIONS} connections, settlements included); ${figures[mode].non2xx} non-2xx`,
    target: '',
  }));
  const result =
    `added p50 ${share(p50('on'), p50('off'))} (${(p50('on') - p50('off')).toFixed(3)} ms), CPU/request ${share(cpu('on'), cpu('off'))} ` +
    `(${(cpu('on') - cpu('off')).toFixed(3)} ms); host steal ${stealPercent(ticksBefore).toFixed(1)} %`;
  console.log(`call journal's cost: ${result}`);
  rows.push({ scenario: "the call journal's cost (on against off)", engine: opts.engine, result, target: 'added p50 and CPU/request within 10 % of the journal off' });
  return rows;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)] ?? 0;
}
