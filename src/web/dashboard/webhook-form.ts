import { ApiError } from '../../http/errors.ts';
import { EVENT_TYPES } from '../../webhooks/events.ts';
import { fieldIssues } from '../form-issues.ts';
import { html, type SafeHtml } from '../html.ts';
import { fieldMessage, invalidAttrs, type FieldErrors } from './fields.ts';

/** A posted webhook form: a checkbox per event, so `events` is absent, one name or several. */
export type WebhookForm = { name?: string; url?: string; events?: string | string[] };

const ALL = '*';
const LABELS = { name: 'Name', url: 'URL', events: 'Events' };

/** The events ticked, "every event" winning over single ones (the API would refuse both together). */
export function eventsOf(form: WebhookForm): string[] {
  const ticked = form.events === undefined ? [] : Array.isArray(form.events) ? form.events : [form.events];
  return ticked.includes(ALL) ? [ALL] : ticked;
}

/** The form as the body POST and PATCH /v1/webhooks take. */
export function webhookBodyOf(form: WebhookForm): { name: string; url: string; events: string[] } {
  return { name: (form.name ?? '').trim(), url: (form.url ?? '').trim(), events: eventsOf(form) };
}

export function webhookFieldErrors(issues: Parameters<typeof fieldIssues>[0]): FieldErrors {
  return fieldIssues(issues, LABELS);
}

/** The field messages of a refusal by the service (the URL check), or null for any other error. */
export function serviceFieldErrors(e: unknown): FieldErrors | null {
  if (e instanceof ApiError && e.code === 'webhook_url_refused') return { url: `URL: the address ${e.issues?.[0]?.message ?? 'is not allowed'}.` };
  if (e instanceof ApiError && e.issues) return webhookFieldErrors(e.issues);
  return null;
}

/** Name, URL and the events to receive, each with its own message; `prefix` keeps ids unique on a page. */
export function webhookFields(prefix: string, values: { name: string; url: string; events: readonly string[] }, errors: FieldErrors): SafeHtml {
  const id = (field: string) => `${prefix}-${field}`;
  const all = values.events.includes(ALL);
  // Older connection.* names stay ticked (and kept) when the webhook already uses them.
  const names = [...EVENT_TYPES, ...values.events.filter((e) => e !== ALL && !(EVENT_TYPES as readonly string[]).includes(e))];
  return html`<label for="${id('name')}">Name</label><input id="${id('name')}" name="name" maxlength="255" value="${values.name}" required${invalidAttrs(id('name'), errors.name)}>
${fieldMessage(id('name'), errors.name)}
<label for="${id('url')}">URL (https)</label><input id="${id('url')}" name="url" type="url" maxlength="2048" value="${values.url}" placeholder="https://example.com/tollgate" required${invalidAttrs(id('url'), errors.url)}>
${fieldMessage(id('url'), errors.url)}
<fieldset class="checks" id="${id('events')}"${errors.events ? html` aria-describedby="${id('events')}-error"` : ''}><legend>Events</legend>
${fieldMessage(id('events'), errors.events)}
<label><input type="checkbox" name="events" value="${ALL}"${all ? html` checked` : ''}> Every event, including ones added later</label>
${names.map((name) => html`<label><input type="checkbox" name="events" value="${name}"${!all && values.events.includes(name) ? html` checked` : ''}> <code>${name}</code></label>`)}
</fieldset>`;
}
