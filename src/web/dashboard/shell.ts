import type { FastifyReply, FastifyRequest } from 'fastify';
import { html, type SafeHtml } from '../html.ts';
import { sendPage, type PageOptions } from '../layout.ts';
import { csrfTokenFor } from '../session.ts';

export const NAV = [
  ['/dashboard', 'Overview'],
  ['/dashboard/requests', 'Requests'],
  ['/dashboard/usage', 'Usage'],
  ['/dashboard/customers', 'Customers'],
  ['/dashboard/meters', 'Meters'],
  ['/dashboard/plans', 'Plans'],
  ['/dashboard/subscriptions', 'Subscriptions'],
  ['/dashboard/checkout-links', 'Checkout links'],
  ['/dashboard/payments', 'Payments'],
  ['/dashboard/spend-keys', 'Spend keys'],
  ['/dashboard/webhooks', 'Webhooks'],
  ['/dashboard/alerts', 'Alerts'],
  ['/dashboard/secret-keys', 'Secret keys'],
  ['/dashboard/account', 'Account'],
] as const;

/** The hidden field every state-changing dashboard form carries. */
export function csrfField(request: FastifyRequest, reply: FastifyReply): SafeHtml {
  return html`<input type="hidden" name="_csrf" value="${csrfTokenFor(request, reply)}">`;
}

/** A signed-in page: the navigation (current page marked for screen readers) and sign-out. */
export function sendDashboardPage(
  request: FastifyRequest,
  reply: FastifyReply,
  current: string,
  opts: Omit<PageOptions, 'header'>,
): FastifyReply {
  const header = html`<header class="top">
<a class="brand" href="/dashboard">Tollgate</a>
<nav aria-label="Dashboard"><ul>
${NAV.map(([href, label]) => html`<li><a href="${href}"${href === current ? html` aria-current="page"` : ''}>${label}</a></li>`)}
</ul></nav>
<form method="post" action="/dashboard/sign-out">${csrfField(request, reply)}<button type="submit">Sign out</button></form>
</header>`;
  return sendPage(reply, { ...opts, header });
}

/** The signed-in merchant of a page under the dashboard's session guard. */
export function merchantOf(request: { merchantId?: string }): string {
  if (!request.merchantId) throw new Error('dashboard page without a session');
  return request.merchantId;
}
