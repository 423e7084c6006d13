/**
 * Validation problems of a dashboard form in plain words, one sentence per field ("Name is
 * required.", "Price per period must have at most 255 characters."), instead of the schema
 * library's own texts ("Too small: expected string to have >=1 characters"). Messages our schemas
 * write themselves are kept, after the field's label.
 */
export type Issue = {
  code?: string;
  path: readonly PropertyKey[];
  message: string;
  origin?: string;
  minimum?: number | bigint;
  maximum?: number | bigint;
  expected?: string;
  format?: string;
  values?: readonly unknown[];
};

/** The schema library's generic texts start so; a message of ours never does. */
const GENERIC_MESSAGE = /^(Too small|Too big|Invalid input|Invalid option|Invalid string|Invalid [a-z ]+:|Unrecognized key|Required$|Expected )/;

function plainPhrase(issue: Issue): string | null {
  const count = (n: number | bigint | undefined) => Number(n ?? 0);
  switch (issue.code) {
    case 'too_small':
      if (issue.origin === 'string') return count(issue.minimum) <= 1 ? 'is required' : `must have at least ${count(issue.minimum)} characters`;
      if (issue.origin === 'array' || issue.origin === 'set') return count(issue.minimum) <= 1 ? 'needs at least one entry' : `needs at least ${count(issue.minimum)} entries`;
      return `must be at least ${count(issue.minimum)}`;
    case 'too_big':
      if (issue.origin === 'string') return `must have at most ${count(issue.maximum)} characters`;
      if (issue.origin === 'array' || issue.origin === 'set') return `takes at most ${count(issue.maximum)} entries`;
      return `must be at most ${count(issue.maximum)}`;
    case 'invalid_type':
      return issue.expected === 'number' || issue.expected === 'int' ? 'must be a whole number' : 'is required';
    case 'invalid_format':
      if (issue.format === 'url') return 'must be a full web address, e.g. https://example.com/hook';
      if (issue.format === 'email') return 'must be an email address';
      return 'is not in the expected form';
    case 'invalid_value':
      return issue.values?.length ? `must be one of: ${issue.values.map(String).join(', ')}` : 'is not one of the choices';
    default:
      return null;
  }
}

/** One issue as a sentence about the field `label` names. */
export function plainIssue(issue: Issue, label: string): string {
  if (!GENERIC_MESSAGE.test(issue.message)) return `${label}: ${issue.message}`;
  return `${label} ${plainPhrase(issue) ?? 'is not valid'}.`;
}

/** Every issue, each about its field (by `labelOf`), joined for one error paragraph. */
export function plainIssues(issues: readonly Issue[], labelOf: (path: readonly PropertyKey[]) => string): string {
  return issues.map((issue) => plainIssue(issue, labelOf(issue.path))).join(' ');
}

/**
 * The issues of a form field by field: the field's name (the issue path's first part) to one
 * plain sentence, so each message can stand under its own input.
 */
export function fieldIssues(issues: readonly Issue[], labels: Readonly<Record<string, string>>): Record<string, string> {
  const byField: Record<string, Issue[]> = {};
  for (const issue of issues) (byField[String(issue.path[0] ?? '')] ??= []).push(issue);
  return Object.fromEntries(Object.entries(byField).map(([field, list]) => [field, plainIssues(list, () => labels[field] ?? 'This field')]));
}
