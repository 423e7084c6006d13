/**
 * The event types Tollgate emits, in one list: the outbox accepts only these, webhooks subscribe
 * to these (or to the older `connection.*` names of the customer events), and docs/webhooks.md
 * documents each with an example (a test keeps the two in step).
 */
export const EVENT_TYPES = [
  'customer.created',
  'customer.deleted',
  'customer.wallet.balance.updated',
  'merchant.wallet.balance.updated',
  'spend_key.limit_reached',
  'checkout.completed',
  'subscription.created',
  'subscription.renewed',
  'subscription.updated',
  'subscription.cancelled',
  'subscription.payment_failed',
  'payment.refunded',
  'alert.triggered',
] as const;

export type EventType = (typeof EVENT_TYPES)[number];

/**
 * The event a merchant sends to one webhook on demand to try it out. It is not subscribable and
 * goes to that webhook only, whatever events it chose.
 */
export const TEST_EVENT = 'webhook.test';

/**
 * Receivers built for the older vocabulary subscribe with these names; their deliveries carry the
 * older name in `event` and the same data.
 */
const LEGACY_EVENT_NAMES = {
  'connection.created': 'customer.created',
  'connection.deleted': 'customer.deleted',
  'connection.wallet.balance.updated': 'customer.wallet.balance.updated',
} as const satisfies Record<string, EventType>;

export type LegacyEventName = keyof typeof LEGACY_EVENT_NAMES;
export type SubscribableEvent = EventType | LegacyEventName;

export const SUBSCRIBABLE_EVENTS = [...EVENT_TYPES, ...(Object.keys(LEGACY_EVENT_NAMES) as LegacyEventName[])] as [
  SubscribableEvent,
  ...SubscribableEvent[],
];

/**
 * The name under which an event of `type` goes to a webhook subscribed to `chosen` (null: every
 * event, by its current name), or null when the webhook did not ask for it.
 */
export function deliveredName(type: string, chosen: readonly string[] | null): string | null {
  if (chosen === null) return type;
  if (chosen.includes(type)) return type;
  for (const name of chosen) {
    if (LEGACY_EVENT_NAMES[name as LegacyEventName] === type) return name;
  }
  return null;
}

/** The body every delivery sends: `event`, never `type`. */
export type EventPayload = { id: string; event: string; created_at: string; data: unknown };

/** The exact bytes of a delivery's body; signatures are computed over this string. */
export function payloadText(event: { id: string; created_at: string; payload: string }, name: string): string {
  // The stored data is already JSON text: spliced in rather than parsed and printed again.
  return `{"id":${JSON.stringify(event.id)},"event":${JSON.stringify(name)},"created_at":${JSON.stringify(event.created_at)},"data":${event.payload}}`;
}
