/**
 * The dashboard's create and edit forms: each field with its label and, after a refused
 * submission, its own message in plain words right above it (the input marked invalid and
 * described by the message), plus a summary at the top. A submission is checked by the same zod
 * schema and handled by the same service function as the API; its validation issues and the
 * service's ApiErrors are mapped here to the fields they are about.
 */
import type { z } from 'zod';
import { ApiError } from '../../http/errors.ts';
import { plainIssue, type Issue } from '../form-issues.ts';
import { html, type SafeHtml } from '../html.ts';

/** The values a form was submitted with (redisplayed after a refusal). */
export type Form = Record<string, string>;
/** A refused form's messages: by field name, and `_form` for what no single field caused. */
export type FieldErrors = Record<string, string>;

export type FormSpec = {
  /** The name of the form field an issue's path is about (its label comes from `labels`). */
  fieldOf?: (path: readonly PropertyKey[]) => string;
  /** Each field's label, as the form shows it. */
  labels: Record<string, string>;
  /** A label naming more than the field (e.g. "Tiers, line 2"), when the issue's path says more. */
  labelOf?: (path: readonly PropertyKey[]) => string | undefined;
  /** ApiError codes that are about one field (e.g. meter_slug_taken → meter_slug). */
  codeFields?: Record<string, string>;
};

const FORM = '_form';

export const formText = (form: Form, name: string) => (form[name] ?? '').trim();

/** Issues as messages on their fields; the first message of a field is kept, the others follow it. */
export function fieldErrorsOf(issues: readonly Issue[], spec: FormSpec): FieldErrors {
  const errors: FieldErrors = {};
  for (const issue of issues) {
    const field = spec.fieldOf ? spec.fieldOf(issue.path) : String(issue.path[0] ?? FORM);
    const key = field in spec.labels ? field : FORM;
    const sentence = plainIssue(issue, spec.labelOf?.(issue.path) ?? spec.labels[key] ?? 'This form');
    errors[key] = errors[key] ? `${errors[key]} ${sentence}` : sentence;
  }
  return errors;
}

export type Submission<T> = { ok: true; value: T } | { ok: false; errors: FieldErrors; status: number };

/**
 * Checks `body` with the API's schema and runs the API's operation on it. Validation problems
 * (the schema's, or the service's own `validation_error` and other refusals) come back as field
 * messages with the status the API would answer; anything else is thrown on.
 */
export async function submit<S extends z.ZodType, T>(schema: S, body: unknown, spec: FormSpec, run: (data: z.infer<S>) => Promise<T>): Promise<Submission<T>> {
  const parsed = schema.safeParse(body);
  if (!parsed.success) return { ok: false, errors: fieldErrorsOf(parsed.error.issues as Issue[], spec), status: 400 };
  try {
    return { ok: true, value: await run(parsed.data) };
  } catch (e) {
    if (!(e instanceof ApiError) || e.status >= 500 || e.code === 'not_found') throw e;
    if (e.issues?.length) return { ok: false, errors: fieldErrorsOf(e.issues, spec), status: e.status };
    const field = spec.codeFields?.[e.code];
    return { ok: false, errors: field ? { [field]: `${spec.labels[field]}: ${e.message}` } : { [FORM]: e.message }, status: e.status };
  }
}

/** The top of a refused form: that nothing was saved, and what no single field caused. */
export function formSummary(errors: FieldErrors | undefined, id: string): SafeHtml | '' {
  if (!errors || Object.keys(errors).length === 0) return '';
  return html`<div class="error" role="alert" id="${id}"><p>Nothing was saved. ${errors[FORM] ?? 'Correct the fields marked below.'}</p></div>`;
}

type FieldOptions = {
  /** The element id; the message's id is `${id}-error`. */
  id: string;
  name: string;
  label: string;
  value: string;
  errors?: FieldErrors | undefined;
  /** A line under the label (format, what blank means). */
  hint?: string | SafeHtml;
};

function describedBy(o: FieldOptions): { message: SafeHtml | ''; attrs: SafeHtml | '' } {
  const message = o.errors?.[o.name];
  const hintId = o.hint ? `${o.id}-hint` : '';
  const ids = [message ? `${o.id}-error` : '', hintId].filter(Boolean).join(' ');
  return {
    message: message ? html`<p class="error field-error" id="${o.id}-error">${message}</p>` : '',
    attrs: html`${message ? html` aria-invalid="true"` : ''}${ids ? html` aria-describedby="${ids}"` : ''}`,
  };
}

function labelled(o: FieldOptions, control: (attrs: SafeHtml | '') => SafeHtml): SafeHtml {
  const { message, attrs } = describedBy(o);
  return html`<div class="field"><label for="${o.id}">${o.label}</label>${o.hint ? html`<p class="muted hint" id="${o.id}-hint">${o.hint}</p>` : ''}${message}${control(attrs)}</div>`;
}

/** A labelled text input (`extra`: attributes such as inputmode or autocomplete, already safe). */
export function textField(o: FieldOptions & { extra?: SafeHtml; type?: string }): SafeHtml {
  return labelled(o, (attrs) => html`<input id="${o.id}" name="${o.name}" type="${o.type ?? 'text'}" value="${o.value}"${o.extra ?? ''}${attrs}>`);
}

export function textareaField(o: FieldOptions & { rows: number }): SafeHtml {
  return labelled(o, (attrs) => html`<textarea id="${o.id}" name="${o.name}" rows="${o.rows}"${attrs}>${o.value}</textarea>`);
}

/** A labelled select; each option a value, or [value, text]. */
export function selectField(o: FieldOptions & { options: readonly (string | readonly [string, string])[] }): SafeHtml {
  return labelled(
    o,
    (attrs) => html`<select id="${o.id}" name="${o.name}"${attrs}>${o.options.map((option) => {
      const [value, text] = typeof option === 'string' ? [option, option] : option;
      return html`<option value="${value}"${value === o.value ? html` selected` : ''}>${text}</option>`;
    })}</select>`,
  );
}
