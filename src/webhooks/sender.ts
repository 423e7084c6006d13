import { Agent, request, type Dispatcher } from 'undici';
import { checkedLookup, ForbiddenAddressError, urlProblem, type Resolver, type UrlPolicy } from './url-safety.ts';

/** How much of a receiver's answer is read: only its status matters, and a receiver must not make us buffer. */
const MAX_RESPONSE_BYTES = 64 * 1024;

export type SendOutcome =
  | { kind: 'answered'; status: number }
  /** No answer: refused address, connection failure, timeout. `error` is a short code, never a URL or body. */
  | { kind: 'failed'; error: string };

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

/** POSTs one delivery and reports the status, reading at most MAX_RESPONSE_BYTES of the answer. */
export async function sendDelivery(
  agent: Dispatcher,
  policy: UrlPolicy,
  target: { url: string; body: string; headers: Record<string, string>; timeoutMs: number },
): Promise<SendOutcome> {
  // An IP literal never goes through the lookup, and the policy may have changed since the URL was saved.
  if (urlProblem(target.url, policy)) return { kind: 'failed', error: 'url_refused' };
  try {
    const res = await request(target.url, {
      method: 'POST',
      dispatcher: agent,
      body: target.body,
      headers: { 'content-type': 'application/json', 'user-agent': 'Tollgate-Webhooks/1', ...target.headers },
      signal: AbortSignal.timeout(target.timeoutMs),
    });
    await res.body.dump({ limit: MAX_RESPONSE_BYTES }).catch(() => {});
    return { kind: 'answered', status: res.statusCode };
  } catch (err) {
    return { kind: 'failed', error: errorCode(err) };
  }
}

function errorCode(err: unknown): string {
  if (err instanceof ForbiddenAddressError || (err as { cause?: unknown })?.cause instanceof ForbiddenAddressError) return 'address_refused';
  const e = err as { name?: string; code?: string };
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError' || e?.code === 'UND_ERR_HEADERS_TIMEOUT' || e?.code === 'UND_ERR_BODY_TIMEOUT' || e?.code === 'UND_ERR_CONNECT_TIMEOUT') {
    return 'timeout';
  }
  return typeof e?.code === 'string' ? e.code.toLowerCase().slice(0, 64) : 'network_error';
}
