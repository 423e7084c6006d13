import { lookup as dnsLookup } from 'node:dns/promises';
import type { LookupAddress } from 'node:dns';
import ipaddr from 'ipaddr.js';

/**
 * Which webhook URLs Tollgate may call. A webhook URL is chosen by a merchant, so without these
 * checks it would be a way to make the server call its own network (SSRF): only public unicast
 * addresses are called, over https. An operator developing locally may allow plain http to
 * loopback (WEBHOOK_ALLOW_HTTP_LOOPBACK); nothing else is ever allowed.
 */
export type UrlPolicy = { allowHttpLoopback: boolean };

/** Resolves a host name to every address it has (dns.lookup, or a test's own). */
export type Resolver = (host: string) => Promise<LookupAddress[]>;

export const systemResolver: Resolver = (host) => dnsLookup(host, { all: true, verbatim: true });

/** Thrown (or passed to a connect callback) when a webhook's host resolves to an address it may not call. */
export class ForbiddenAddressError extends Error {
  readonly code = 'EWEBHOOKFORBIDDEN';
}

function parsedUrl(raw: string): URL | null {
  try {
    return new URL(raw);
  } catch {
    return null;
  }
}

/** The host of a URL without IPv6 brackets. */
function bareHost(url: URL): string {
  return url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
}

function literalAddress(host: string): ipaddr.IPv4 | ipaddr.IPv6 | null {
  // process() turns an IPv4-mapped IPv6 address (::ffff:127.0.0.1) into the IPv4 one it carries.
  return ipaddr.isValid(host) ? ipaddr.process(host) : null;
}

/** Why an address may not be called, or null when it may. */
export function addressProblem(address: string, policy: UrlPolicy): string | null {
  const parsed = literalAddress(address);
  if (!parsed) return 'is not an IP address';
  const range = parsed.range();
  if (isIpv4Compatible(parsed)) return `is an IPv4-compatible IPv6 address (${parsed.toString()}), which webhooks may not call`;
  if (range === 'unicast' || (range === 'loopback' && policy.allowHttpLoopback)) return null;
  return `points at a ${range} address (${parsed.toString()}), which webhooks may not call`;
}

/**
 * ::a.b.c.d (::/96 besides :: and ::1): deprecated, and ipaddr.js calls it unicast, though
 * [::127.0.0.1], which URL writes [::7f00:1], carries a loopback address.
 */
function isIpv4Compatible(address: ipaddr.IPv4 | ipaddr.IPv6): boolean {
  if (address.kind() !== 'ipv6') return false;
  const parts = (address as ipaddr.IPv6).parts;
  return parts.slice(0, 6).every((p) => p === 0) && (parts[6] !== 0 || parts[7]! > 1);
}

function isLoopbackHost(host: string): boolean {
  const literal = literalAddress(host);
  if (literal) return literal.range() === 'loopback';
  return host === 'localhost' || host.endsWith('.localhost');
}

/**
 * Why a webhook URL is refused by its text alone (scheme, credentials, IP literal), or null. Host
 * names are checked by resolving them (urlProblemAfterLookup, and again at every delivery).
 */
export function urlProblem(raw: string, policy: UrlPolicy): string | null {
  const url = parsedUrl(raw);
  if (!url) return 'must be an absolute URL';
  if (url.username || url.password) return 'must not contain a user name or password';
  if (url.port === '0') return 'must not use port 0';
  const host = bareHost(url);
  if (url.protocol === 'http:') {
    if (!policy.allowHttpLoopback) return 'must use https://';
    if (!isLoopbackHost(host)) return 'must use https:// (plain http is allowed only for loopback in development)';
  } else if (url.protocol !== 'https:') {
    return 'must use https://';
  }
  return literalAddress(host) ? addressProblem(host, policy) : null;
}

/**
 * The same, then the host's addresses: a name that resolves to a private address is refused when
 * the webhook is saved. A name that does not resolve now is accepted (DNS may be down or the
 * record not yet published); deliveries check again anyway.
 */
export async function urlProblemAfterLookup(raw: string, policy: UrlPolicy, resolve: Resolver): Promise<string | null> {
  const problem = urlProblem(raw, policy);
  if (problem) return problem;
  const host = bareHost(new URL(raw));
  if (literalAddress(host)) return null;
  let addresses: LookupAddress[];
  try {
    addresses = await resolve(host);
  } catch {
    return null;
  }
  return firstAddressProblem(addresses, policy, host);
}

function firstAddressProblem(addresses: LookupAddress[], policy: UrlPolicy, host: string): string | null {
  for (const { address } of addresses) {
    const problem = addressProblem(address, policy);
    if (problem) return `host ${host} ${problem}`;
  }
  return addresses.length === 0 ? `host ${host} has no address` : null;
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/**
 * A `lookup` for the connections of deliveries: it resolves the host, refuses the connection when
 * any of its addresses is forbidden, and hands the socket exactly the addresses it checked, so a
 * name that changes its answer between a check and the connect (DNS rebinding) cannot slip through.
 */
export function checkedLookup(policy: UrlPolicy, resolve: Resolver) {
  return (host: string, options: { all?: boolean }, callback: LookupCallback): void => {
    resolve(host).then(
      (addresses) => {
        const problem = firstAddressProblem(addresses, policy, host);
        if (problem) return callback(new ForbiddenAddressError(problem), '');
        if (options.all) return callback(null, addresses);
        const first = addresses[0]!;
        callback(null, first.address, first.family);
      },
      (err: NodeJS.ErrnoException) => callback(err, ''),
    );
  };
}
