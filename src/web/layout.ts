import type { FastifyReply } from 'fastify';
import { html, type SafeHtml } from './html.ts';

/**
 * The page shell every server-rendered page shares (dashboard, CLI authorization, hosted
 * checkout): one stylesheet and scripts served by Tollgate itself, and headers that forbid
 * everything else. No inline script or style is ever needed, so the policy has no 'unsafe-inline'.
 */
export type PageOptions = {
  title: string;
  main: SafeHtml;
  /** Above <main>: e.g. the dashboard's navigation. */
  header?: SafeHtml;
  /** Paths under /assets/ of extra scripts (loaded deferred, same origin). */
  scripts?: string[];
  /** Paths under /assets/ of extra stylesheets. */
  styles?: string[];
  /**
   * Origins a form on this page may submit (or be redirected) to besides our own, e.g. the CLI's
   * loopback listener `http://127.0.0.1:53211`.
   */
  formTargets?: string[];
  /**
   * The one origin that may embed this page in a frame (the hosted checkout: its session's
   * `origin_url`); without it no page may be framed.
   */
  frameAncestors?: string;
  status?: number;
};

const STYLESHEET = '/assets/tollgate.css';

/** An origin as a CSP source: exactly `scheme://host[:port]`, so nothing else can slip into the policy. */
function originSource(origin: string): string {
  if (new URL(origin).origin !== origin) throw new RangeError(`not an origin: ${origin}`);
  return origin;
}

function contentSecurityPolicy(formTargets: string[] = [], frameAncestors?: string): string {
  return [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    `form-action 'self'${formTargets.map((t) => ` ${t}`).join('')}`,
    `frame-ancestors ${frameAncestors ? originSource(frameAncestors) : "'none'"}`,
    "base-uri 'none'",
  ].join('; ');
}

/**
 * Headers of every HTML page: the policy above, no framing (but by `frameAncestors`), no referrer,
 * never cached. X-Frame-Options cannot name one allowed origin, so a page that one origin may
 * frame relies on the policy's frame-ancestors alone.
 */
function pageHeaders(formTargets: string[] = [], frameAncestors?: string): Record<string, string> {
  return {
    'content-type': 'text/html; charset=utf-8',
    'content-security-policy': contentSecurityPolicy(formTargets, frameAncestors),
    'x-content-type-options': 'nosniff',
    ...(frameAncestors ? {} : { 'x-frame-options': 'DENY' }),
    // The CLI authorization URL carries its state; a page never leaks its address onward.
    'referrer-policy': 'no-referrer',
    'cache-control': 'no-store',
  };
}

function renderPage(opts: PageOptions): string {
  const styles = [STYLESHEET, ...(opts.styles ?? [])];
  return `<!doctype html>${html`<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${opts.title} · Tollgate</title>
${styles.map((href) => html`<link rel="stylesheet" href="${href}">`)}
${(opts.scripts ?? []).map((src) => html`<script src="${src}" defer></script>`)}
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
${opts.header}
<main id="main" tabindex="-1">
${opts.main}
</main>
</body>
</html>`}`;
}

export function sendPage(reply: FastifyReply, opts: PageOptions): FastifyReply {
  return reply
    .status(opts.status ?? 200)
    .headers(pageHeaders(opts.formTargets, opts.frameAncestors))
    .send(renderPage(opts));
}
