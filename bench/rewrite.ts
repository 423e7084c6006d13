/**
 * Rewrite-proxy benchmark: the same chat call sent as an Anthropic Messages request through
 * `/v1/rewrite/anthropic/<OpenAI chat URL>` (translated both ways) and as an OpenAI request through
 * `/v1/forward`, to the same OpenAI-shaped mock, streaming and not. Slices of each alternate, each
 * followed by its settlements, so the two CPU figures per request see the same machine; the target
 * is the rewrite within 25 % of plain forward.
 */
import type { Storage } from '../src/storage/db.ts';
import { forwardClient, measure, waitForSettlements, type GatewayRow } from './gateway.ts';
import { cpuMs, machineTicks, stealPercent } from './process-stats.ts';

const SLICE_SECONDS = 2;
const CONNECTIONS = 32;

/** The same JSON is an OpenAI and an Anthropic request: one user message, a cap of 8 tokens. */
const chatBody = (stream: boolean) =>
  JSON.stringify({ model: 'gpt-4o', stream, max_tokens: 8, messages: [{ role: 'user', content: 'Say something short please' }] });

export async function benchRewrite(opts: { engine: string; storage: Storage; serverUrl: string; serverPid: number; seconds: number }): Promise<GatewayRow[]> {
  const { forwardUrl, forwardHeaders, merchantId } = await forwardClient(opts.storage, opts.serverUrl);
  const rewriteUrl = `${opts.serverUrl}/v1/rewrite/anthropic/https://api.openai.com/v1/chat/completions`;
  const rows: GatewayRow[] = [];
  for (const stream of [false, true]) {
    const paths = {
      forward: { url: forwardUrl, body: chatBody(stream) },
      rewrite: { url: rewriteUrl, body: chatBody(stream) },
    };
    // Warm both paths up, so the JIT has settled on each before anything is measured.
    for (const path of Object.values(paths)) await measure(path.url, forwardHeaders, path.body, CONNECTIONS, 1);
    await waitForSettlements(opts.storage, merchantId);
    const totals = { forward: { cpu: 0, ok: 0, non2xx: 0, rate: 0 }, rewrite: { cpu: 0, ok: 0, non2xx: 0, rate: 0 } };
    const ticksBefore = machineTicks();
    const slices = Math.max(1, Math.round(opts.seconds / SLICE_SECONDS));
    for (let i = 0; i < slices; i++) {
      for (const name of ['forward', 'rewrite'] as const) {
        const before = cpuMs(opts.serverPid);
        const run = await measure(paths[name].url, forwardHeaders, paths[name].body, CONNECTIONS, opts.seconds / slices);
        await waitForSettlements(opts.storage, merchantId);
        totals[name].cpu += cpuMs(opts.serverPid) - before;
        totals[name].ok += run.ok;
        totals[name].non2xx += run.non2xx;
        totals[name].rate += run.perSecond / slices;
      }
    }
    const per = (name: 'forward' | 'rewrite') => totals[name].cpu / Math.max(1, totals[name].ok);
    const ratio = per('rewrite') / Math.max(per('forward'), 1e-9);
    const result =
      `rewrite CPU ${per('rewrite').toFixed(3)} ms/request vs forward ${per('forward').toFixed(3)} (${((ratio - 1) * 100).toFixed(1)} % more; settlements included); ` +
      `${totals.rewrite.rate.toFixed(0)} req/s vs ${totals.forward.rate.toFixed(0)}; ${totals.rewrite.non2xx + totals.forward.non2xx} non-2xx; host steal ${stealPercent(ticksBefore).toFixed(1)} %`;
    const label = `rewrite (Anthropic client → OpenAI-shaped mock) ${stream ? 'streaming' : 'non-streaming'}, ${CONNECTIONS} connections`;
    console.log(`${label}: ${result}`);
    rows.push({ scenario: label, engine: opts.engine, result, target: 'CPU/request ≤ 1.25 × forward' });
  }
  return rows;
}
