import type { SavedMethod } from '../payments/types.ts';

/**
 * What the commerce flows keep in process between requests. It is the app's (made by buildApp,
 * decision 0020), not a module's: two apps in one process share nothing but their database.
 */
export class CommerceState {
  /** Auto top-up purchases in progress, by reference: each waits for the turn before it. */
  readonly purchaseTurns = new Map<string, Promise<void>>();
  /** Callers of auto top-up waiting for a wallet's holds to settle, by wallet and what they saw: one look for all. */
  readonly holdWaits = new Map<string, Promise<boolean>>();
  /**
   * The method a payment that needs confirmation will save, kept until the confirmation (in this
   * process; a confirmation served by another instance completes without saving the method).
   */
  readonly savedAwaitingConfirmation = new Map<string, SavedMethod>();
}
