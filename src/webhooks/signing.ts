import { createHmac } from 'node:crypto';
import { SECRET_PREFIX } from '../domain/ids.ts';

/**
 * The signature headers of one delivery. Two schemes, for two kinds of receiver:
 * - `X-Webhook-Signature`: lowercase hex HMAC-SHA256 of the raw body, keyed with the whole secret
 *   string (what receivers of the reference service check). During a rotation overlap the
 *   replaced secret's signature goes in `X-Webhook-Signature-Previous`.
 * - Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`): HMAC-SHA256 of
 *   `<id>.<timestamp>.<body>` keyed with the base64-decoded secret after `whsec_`, as `v1,<base64>`,
 *   one per valid secret separated by spaces; the timestamp lets receivers refuse replays.
 * `secrets` is newest first.
 */
export function signatureHeaders(body: string, eventId: string, secrets: string[], timestampSeconds: number): Record<string, string> {
  const [current, previous] = secrets;
  const headers: Record<string, string> = {
    'x-webhook-signature': hexSignature(current!, body),
    'webhook-id': eventId,
    'webhook-timestamp': String(timestampSeconds),
    'webhook-signature': secrets.map((s) => `v1,${standardSignature(s, eventId, timestampSeconds, body)}`).join(' '),
  };
  if (previous !== undefined) headers['x-webhook-signature-previous'] = hexSignature(previous, body);
  return headers;
}

function hexSignature(secret: string, body: string): string {
  return createHmac('sha256', secret).update(body).digest('hex');
}

function standardSignature(secret: string, id: string, timestampSeconds: number, body: string): string {
  const key = Buffer.from(secret.startsWith(SECRET_PREFIX.webhook) ? secret.slice(SECRET_PREFIX.webhook.length) : secret, 'base64');
  return createHmac('sha256', key).update(`${id}.${timestampSeconds}.${body}`).digest('base64');
}
