import type { FastifyReply, FastifyRequest } from 'fastify';
import { html, type SafeHtml } from '../html.ts';
import { csrfField, sendDashboardPage } from './shell.ts';

export type Confirmation = {
  /** The page's heading, a question: "Revoke the spend key Team A?" */
  question: string;
  /** What happens, in plain words, and whether it can be undone. */
  consequence: SafeHtml | string;
  /** The form's target: the same POST the action always had. */
  action: string;
  /** The button that does it: "Revoke the key". */
  confirmLabel: string;
  /** Where "Go back" leads, nothing changed. */
  back: string;
};

/**
 * The step between a destructive button and its effect (revoke, rotate, cancel): a page of its
 * own that says what will happen, with the one button that does it and a way back. A plain link
 * leads here and a plain form leaves, so it works without JavaScript, and nothing is changed by
 * a GET.
 */
export function sendConfirmPage(request: FastifyRequest, reply: FastifyReply, current: string, c: Confirmation): FastifyReply {
  return sendDashboardPage(request, reply, current, {
    title: c.question,
    main: html`<h1>${c.question}</h1>
<form class="card" method="post" action="${c.action}" id="confirm-form">
${csrfField(request, reply)}
<p>${c.consequence}</p>
<button class="danger" type="submit">${c.confirmLabel}</button>
<a class="button secondary" href="${c.back}">Go back</a>
</form>`,
  });
}

/** A link styled as a button that opens a confirmation page; the label says a step follows. */
export function confirmLink(href: string, label: string, accessibleName: string, danger = false): SafeHtml {
  return html`<a class="button ${danger ? 'danger' : 'secondary'}" href="${href}" aria-label="${accessibleName}">${label}…</a>`;
}
