import { Agent, request, type Dispatcher } from 'undici';
import { checkedLookup, ForbiddenAddressError, urlProblem, type Resolver, type UrlPolicy } from './url-safety.ts';

/** How much of a receiver's answer is read: a receiver must not make us buffer, or hold a slot by streaming. */
const MAX_RESPONSE_BYTES = 64 * 1024;
/** How much of the answer is kept, for the merchant to see what their receiver said. */
export const RESPONSE_EXCERPT_BYTES = 1024;

export type SendOutcome =
  /** `body`: the answer's first RESPONSE_EXCERPT_BYTES as UTF-8; `ms`: how long the exchange took. */
  | { kind: 'answered'; status: number; body: string; ms: number }
  /** No answer: refused address, connection failure, timeout. `error` is a short code, never a URL or body. */
  | { kind: 'failed'; error: string; ms: number };

/**
 * One client for every delivery. Its connections resolve the host themselves through the checked
 * lookup, so the address a socket connects to is the one that was checked; redirects are never
 * followed (undici's request does not follow them, and no redirect interceptor is installed).
 */
export function createDeliveryAgent(policy: UrlPolicy, resolve: Resolver, timeoutMs: number): Dispatcher {
  return new Agent({
    keepAliveTimeout: 10_000,
    connections: 8,
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    connect: { timeout: timeoutMs, lookup: checkedLookup(policy, resolve) as never },
  });
}

/**
 * POSTs one delivery and reports the status and the start of the answer, reading at most
 * MAX_RESPONSE_BYTES of it. The duration is measured with the process's monotonic timer: it is a
 * length of time shown to the merchant, not a timestamp or a decision, so it does not come from
 * the app's clock (which stands still in tests).
 */
export async function sendDelivery(
  agent: Dispatcher,
  policy: UrlPolicy,
  target: { url: string; body: string; headers: Record<string, string>; timeoutMs: number },
): Promise<SendOutcome> {
  // An IP literal never goes through the lookup, and the policy may have changed since the URL was saved.
  if (urlProblem(target.url, policy)) return { kind: 'failed', error: 'url_refused', ms: 0 };
  const started = performance.now();
  const ms = () => Math.round(performance.now() - started);
  try {
    const res = await request(target.url, {
      method: 'POST',
      dispatcher: agent,
      body: target.body,
      headers: { 'content-type': 'application/json', 'user-agent': 'Tollgate-Webhooks/1', ...target.headers },
      signal: AbortSignal.timeout(target.timeoutMs),
    });
    const body = await excerptOf(res.body);
    return { kind: 'answered', status: res.statusCode, body, ms: ms() };
  } catch (err) {
    return { kind: 'failed', error: errorCode(err), ms: ms() };
  }
}

/** Reads the answer up to MAX_RESPONSE_BYTES (so the connection can be reused) and keeps its start. */
async function excerptOf(body: AsyncIterable<Buffer> & { destroy(): unknown }): Promise<string> {
  const kept: Buffer[] = [];
  let keptBytes = 0;
  let readBytes = 0;
  try {
    for await (const chunk of body) {
      readBytes += chunk.length;
      if (keptBytes < RESPONSE_EXCERPT_BYTES) {
        const part = chunk.subarray(0, RESPONSE_EXCERPT_BYTES - keptBytes);
        kept.push(part);
        keptBytes += part.length;
      }
      if (readBytes >= MAX_RESPONSE_BYTES) break;
    }
  } catch {
    // An answer cut short keeps what arrived before the cut.
  }
  return Buffer.concat(kept).toString('utf8');
}

function errorCode(err: unknown): string {
  if (err instanceof ForbiddenAddressError || (err as { cause?: unknown })?.cause instanceof ForbiddenAddressError) return 'address_refused';
  const e = err as { name?: string; code?: string };
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError' || e?.code === 'UND_ERR_HEADERS_TIMEOUT' || e?.code === 'UND_ERR_BODY_TIMEOUT' || e?.code === 'UND_ERR_CONNECT_TIMEOUT') {
    return 'timeout';
  }
  return typeof e?.code === 'string' ? e.code.toLowerCase().slice(0, 64) : 'network_error';
}
