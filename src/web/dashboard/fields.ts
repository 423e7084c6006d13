import { html, type SafeHtml } from '../html.ts';

/** A form's problems by field name, each one plain sentence (form-issues.ts fieldIssues). */
export type FieldErrors = Readonly<Record<string, string>>;

/** The message under an input, tied to it by id (see invalidAttrs); nothing when the field is fine. */
export function fieldMessage(inputId: string, message: string | undefined): SafeHtml | '' {
  return message ? html`<p class="error" role="alert" id="${inputId}-error">${message}</p>` : '';
}

/** The attributes that mark an input invalid and point a screen reader at its message. */
export function invalidAttrs(inputId: string, message: string | undefined): SafeHtml | '' {
  return message ? html` aria-invalid="true" aria-describedby="${inputId}-error"` : '';
}
