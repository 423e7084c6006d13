import { MIN_PASSWORD_LENGTH } from '../storage/merchants.ts';
import { html, type SafeHtml } from './html.ts';

export type PasswordProblem = { field: string; message: string };

/** A labelled password input; with a problem, it is marked invalid and described by its message. */
export function passwordInput(name: string, label: string, autocomplete: string, problem?: PasswordProblem): SafeHtml {
  const mine = problem?.field === name ? problem.message : '';
  return html`<label for="${name}">${label}</label>
${mine ? html`<p class="error" id="${name}-error">${mine}</p>` : ''}
<input id="${name}" name="${name}" type="password" autocomplete="${autocomplete}" required${
    mine ? html` aria-invalid="true" aria-describedby="${name}-error"` : ''
  }>`;
}

/** The new-password pair of the change and reset forms. */
export function newPasswordInputs(problem?: PasswordProblem): SafeHtml {
  return html`${passwordInput('new_password', 'New password', 'new-password', problem)}
<p class="muted">At least ${MIN_PASSWORD_LENGTH} characters.</p>
${passwordInput('confirm_password', 'New password again', 'new-password', problem)}`;
}

/** What is wrong with a chosen password and its repetition, in words for the field it belongs to. */
export function newPasswordProblem(form: Record<string, string | undefined>): PasswordProblem | null {
  const chosen = form.new_password ?? '';
  if (chosen.length < MIN_PASSWORD_LENGTH) {
    return { field: 'new_password', message: `Choose a password of at least ${MIN_PASSWORD_LENGTH} characters.` };
  }
  if (chosen !== (form.confirm_password ?? '')) return { field: 'confirm_password', message: 'The two new passwords differ. Type the same one twice.' };
  return null;
}
