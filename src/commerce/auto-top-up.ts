import { sql, type ExpressionBuilder } from 'kysely';
import { dateOf } from '../domain/clock.ts';
import { fundWallet } from '../ledger/funding.ts';
import { admittableOf } from '../ledger/decide/admission.ts';
import type { UnwrittenHolds } from '../ledger/wallets.ts';
import type { Storage } from '../storage/db.ts';
import type { Database } from '../storage/schema.ts';
import { ProviderUnavailableError, UNANSWERED, type ChargeOutcome } from '../payments/types.ts';
import { findPayment, insertPayment, latestPaymentMethod, transitionPayment, type PaymentRow } from '../storage/subscriptions.ts';
import { savedMethodOf, type PurchaseDeps } from './subscriptions.ts';

/**
 * Auto top-up: when a subscribed customer's wallet cannot cover what a request needs and the
 * subscription names an auto top-up bundle, that bundle is bought with the saved payment method
 * and its credit added to the bundle bucket. Concurrent requests short of money buy it once: the
 * purchase is numbered (the n-th of the subscription), the number is read in the same statement as
 * the balance, the payment row is unique per number, and a purchase still being paid is waited
 * for rather than followed by another: callers that saw the same shortfall race for the same row,
 * and the losers wait for the winner's outcome.
 *
 * Every billed path (POST /v1/requests, forward, drop-in, rewrite) reaches it through
 * `admitWithAutoTopUp` around its call into the ledger.
 */
/** The longest a caller waits for another's purchase on PostgreSQL (the database's lock_timeout). */
const WAIT_LIMIT_MS = 10_000;

/**
 * `cannot_cover`: not even MAX_PURCHASES_PER_REQUEST bundles would cover the request, so none is
 * bought. `waited`: the shortfall was holds in flight, and some of them settled meanwhile.
 */
export type TopUpResult = 'covered' | 'bought' | 'bought_by_another' | 'waited' | 'no_auto_top_up' | 'payment_failed' | 'cannot_cover';

/** The most bundles one request's shortage buys, one after another. */
export const MAX_PURCHASES_PER_REQUEST = 5;

/**
 * Makes the wallet able to cover `needed`, or says why it cannot: the purchase is decided against
 * settled spend (decision 0037). When the wallet is short only because of holds of requests still
 * in flight (its balance, as if nothing were held, covers the request), nothing is bought: the
 * caller waits for holds to settle (they usually settle lower than held) and looks again; only a
 * balance that is short by itself buys the bundle.
 */
export async function topUpIfShort(deps: PurchaseDeps, walletId: string, needed: bigint, now: Date, unwritten: UnwrittenHolds | null = null): Promise<TopUpResult> {
  const { storage } = deps;
  const sub = await storage.db
    .selectFrom('subscriptions')
    .innerJoin('connections', 'connections.id', 'subscriptions.connection_id')
    .innerJoin('credit_bundles', 'credit_bundles.id', 'subscriptions.auto_top_up_bundle_id')
    .select(['subscriptions.id', 'subscriptions.merchant_id', 'subscriptions.connection_id', 'credit_bundles.name', 'credit_bundles.cost', 'credit_bundles.credit_amount'])
    .where('connections.wallet_id', '=', walletId)
    .where('subscriptions.status', 'in', ['active', 'past_due'])
    .where('credit_bundles.deleted_at', 'is', null)
    .executeTakeFirst();
  if (!sub) return 'no_auto_top_up';

  const stamp = now.toISOString();
  // A purchase that is still being paid is waited for, then the balance is read again.
  for (let round = 0; round < 3; round++) {
    const snapshot = await shortfallSnapshot(deps, walletId, sub.id, needed, unwritten);
    if (snapshot.available >= needed) return round === 0 ? 'covered' : 'bought_by_another';
    if (snapshot.lastPending) {
      if ((await outcomeOf(deps, snapshot.lastPending)) === 'failed') return 'payment_failed';
      continue;
    }
    // Short only by what is held: the holds settle first (a purchase now would buy against them).
    if (snapshot.settled >= needed && snapshot.held > 0n && (await holdsSettled(deps, walletId, snapshot, unwritten))) return 'waited';
    if (snapshot.settled + BigInt(sub.credit_amount) * BigInt(MAX_PURCHASES_PER_REQUEST) < needed) return 'cannot_cover';
    const reference = `${sub.id}:${snapshot.bought + 1n}`;
    // The purchase holds its turn from before its row exists until its outcome is written, so a
    // caller that finds the row pending, or loses the race to insert it, waits for that turn.
    const bought = await inPurchaseTurn(deps, reference, async () => {
      const payment = await insertPayment(storage.db, {
        merchant_id: sub.merchant_id,
        connection_id: sub.connection_id,
        provider: deps.payments.id,
        provider_ref: null,
        purpose: 'auto_top_up',
        reference,
        amount: BigInt(sub.cost),
        status: 'pending',
        failure_reason: null,
        created_at: stamp,
        updated_at: stamp,
      });
      return payment ? buy(deps, sub, walletId, payment, stamp) : null;
    });
    if (bought === 'timed_out') return 'payment_failed';
    if (bought !== null) return bought;
    // Another caller bought this number; its turn is over, so its outcome is written.
    if ((await findPayment(storage.db, 'auto_top_up', reference))?.status !== 'succeeded') return 'payment_failed';
  }
  return 'bought_by_another';
}

type Purchase = { merchant_id: string; connection_id: string; name: string; credit_amount: bigint | string };

/** Charges the purchase's payment row (its id is the idempotency key) and credits it once paid. */
async function buy(deps: PurchaseDeps, sub: Purchase, walletId: string, payment: PaymentRow, stamp: string): Promise<TopUpResult> {
  const { storage } = deps;
  const method = await latestPaymentMethod(storage.db, sub.connection_id);
  let outcome: ChargeOutcome;
  try {
    outcome = method
      ? await deps.payments.chargeSaved({ amount: payment.amount, idempotencyKey: payment.id, description: `${sub.name}: auto top-up`, method: savedMethodOf(method) })
      : { status: 'failed', providerRef: null, reason: 'The customer has no saved payment method.' };
  } catch (e) {
    if (!(e instanceof ProviderUnavailableError)) throw e;
    // Recorded as a failed purchase (those waiting on it give up; the next shortage buys anew), and
    // the request is answered 503 with Retry-After. Should the provider have taken the money after
    // all, its event credits this purchase (processProviderEvent).
    await transitionPayment(storage.db, payment.id, ['pending'], { status: 'failed', failure_reason: UNANSWERED, updated_at: stamp });
    throw e;
  }
  if (outcome.status !== 'succeeded') {
    const reason = outcome.status === 'failed' ? outcome.reason : 'requires_action';
    await transitionPayment(storage.db, payment.id, ['pending'], { status: 'failed', provider_ref: outcome.providerRef, failure_reason: reason, updated_at: stamp });
    return 'payment_failed';
  }
  await creditPurchase(deps, payment, walletId, { bucket: 'bundle', amount: BigInt(sub.credit_amount), description: `${sub.name}: auto top-up` }, outcome.providerRef, stamp);
  return 'bought';
}

/**
 * A purchase the provider confirmed is credited in the transaction that marks it succeeded, only
 * if that compare-and-set happened: the charging call and the provider's event racing credit once.
 */
async function creditPurchase(
  deps: PurchaseDeps,
  payment: PaymentRow,
  walletId: string,
  credit: { bucket: 'bundle' | 'prepaid'; amount: bigint; description: string },
  providerRef: string,
  stamp: string,
): Promise<boolean> {
  return deps.storage.db.transaction().execute(async (trx) => {
    if (!(await transitionPayment(trx, payment.id, ['pending'], { status: 'succeeded', provider_ref: providerRef, updated_at: stamp }))) return false;
    deps.faultAt?.('credit');
    await fundWallet(trx, { merchantId: payment.merchant_id, walletId, ...credit, source: 'payment', reference: payment.id, at: stamp });
    return true;
  });
}

/**
 * An auto top-up its charging call did not settle (the process died during the call, or the
 * provider did not answer it) that the provider reports succeeded (its webhook event): credited
 * once, as the call would have. The bundle is the subscription's auto top-up bundle if it still
 * costs what was paid; otherwise (changed since) the payment is credited as prepaid funds.
 */
export async function settleTopUpFromProvider(deps: PurchaseDeps, payment: PaymentRow, outcome: ChargeOutcome): Promise<'credited' | 'unchanged'> {
  if (payment.purpose !== 'auto_top_up' || outcome.status !== 'succeeded') return 'unchanged';
  const subscriptionId = payment.reference.split(':')[0]!;
  const row = await deps.storage.db
    .selectFrom('subscriptions')
    .innerJoin('connections', 'connections.id', 'subscriptions.connection_id')
    .leftJoin('credit_bundles', 'credit_bundles.id', 'subscriptions.auto_top_up_bundle_id')
    .select(['connections.wallet_id', 'credit_bundles.name', 'credit_bundles.cost', 'credit_bundles.credit_amount'])
    .where('subscriptions.id', '=', subscriptionId)
    .executeTakeFirst();
  if (!row) return 'unchanged';
  const sameBundle = row.cost !== null && row.credit_amount !== null && BigInt(row.cost) === payment.amount;
  const credit = sameBundle
    ? { bucket: 'bundle' as const, amount: BigInt(row.credit_amount!), description: `${row.name}: auto top-up` }
    : { bucket: 'prepaid' as const, amount: payment.amount, description: 'Auto top-up (its bundle changed since)' };
  const credited = await creditPurchase(deps, payment, row.wallet_id, credit, outcome.providerRef, dateOf(deps.clock).toISOString());
  return credited ? 'credited' : 'unchanged';
}

/**
 * One statement, so one snapshot on either engine: what the wallet has, how many purchases the
 * subscription made, and the one still being paid, if any. A purchase's success and its credit
 * commit together, so a snapshot never sees one without the other.
 */
async function shortfallSnapshot(deps: PurchaseDeps, walletId: string, subscriptionId: string, needed: bigint, unwritten: UnwrittenHolds | null) {
  const purchases = (eb: ExpressionBuilder<Database, 'wallets'>) =>
    eb.selectFrom('payments').where('purpose', '=', 'auto_top_up').where('reference', 'like', `${subscriptionId}:%`);
  const row = await deps.storage.db
    .selectFrom('wallets')
    .select([
      'wallets.id',
      'wallets.balance',
      'wallets.held',
      'wallets.overrun',
      'wallets.cycle_credit',
      'wallets.bundle_credit',
      (eb) => purchases(eb).select((p) => p.fn.countAll<bigint>().as('n')).as('bought'),
      (eb) => purchases(eb).select('reference').where('status', '=', 'pending').limit(1).as('pending'),
    ])
    .where('id', '=', walletId)
    .executeTakeFirstOrThrow();
  // The admission's own rule (admittableOf), overrun allowance and the holds this process admitted
  // and has not written yet (SQLite's deferred admission; a short call's settlement may write its
  // hold never) included: a wallet this calls covered is one the retried admission admits.
  const wallet = { id: row.id, balance: BigInt(row.balance), held: BigInt(row.held), overrun: row.overrun, cycle_credit: BigInt(row.cycle_credit), bundle_credit: BigInt(row.bundle_credit) };
  const available = admittableOf(wallet, unwritten, true, needed);
  // What the wallet could take once every hold in flight settled at nothing: its settled money.
  const settled = admittableOf({ ...wallet, held: 0n }, null, true, needed);
  return { available, settled, held: heldOn(wallet, unwritten), balance: wallet.balance, bought: BigInt(row.bought ?? 0n), lastPending: row.pending };
}

/** Waits for the purchase in progress under `reference` to end, and tells how it ended. */
async function outcomeOf(deps: PurchaseDeps, reference: string): Promise<'succeeded' | 'failed'> {
  const payment = await inPurchaseTurn(deps, reference, () => findPayment(deps.storage.db, 'auto_top_up', reference));
  // Still pending once its turn is over: its purchaser died during the call (its event settles it).
  return payment !== 'timed_out' && payment?.status === 'succeeded' ? 'succeeded' : 'failed';
}

/**
 * Runs `work` in the purchase's turn: one caller at a time per purchase (its reference). Callers of
 * one process queue in process (one promise chain per reference, kept on the app's CommerceState, so no
 * connection is held while waiting); on PostgreSQL the first of each process then takes a
 * session advisory lock on the reference, so instances take turns too. No clock is polled: a wait
 * ends when the turn before it ends, which its provider call's own timeout bounds, and the
 * database gives up a lock wait after WAIT_LIMIT_MS (`lock_timeout`): then 'timed_out'.
 */
async function inPurchaseTurn<T>(deps: PurchaseDeps, reference: string, work: () => Promise<T>): Promise<T | 'timed_out'> {
  const { storage } = deps;
  return inProcessTurn(deps.commerceState.purchaseTurns, reference, () => (storage.dialect === 'postgres' ? withAdvisoryLock(storage, `auto_top_up:${reference}`, work) : work()));
}

async function inProcessTurn<T>(queued: Map<string, Promise<void>>, reference: string, work: () => Promise<T>): Promise<T> {
  const before = queued.get(reference) ?? Promise.resolve();
  let done!: () => void;
  const mine = before.then(() => new Promise<void>((resolve) => (done = resolve)));
  queued.set(reference, mine);
  await before;
  try {
    return await work();
  } finally {
    done();
    if (queued.get(reference) === mine) queued.delete(reference);
  }
}

async function withAdvisoryLock<T>(storage: Storage, name: string, work: () => Promise<T>): Promise<T | 'timed_out'> {
  return storage.db.connection().execute(async (conn) => {
    await sql`set lock_timeout = ${sql.lit(`${WAIT_LIMIT_MS}ms`)}`.execute(conn);
    try {
      await sql`select pg_advisory_lock(hashtext(${name}))`.execute(conn);
    } catch (e) {
      if ((e as { code?: string }).code === LOCK_NOT_AVAILABLE) return 'timed_out' as const;
      throw e;
    } finally {
      await sql`set lock_timeout = 0`.execute(conn);
    }
    try {
      return await work();
    } finally {
      await sql`select pg_advisory_unlock(hashtext(${name}))`.execute(conn);
    }
  });
}

/** PostgreSQL's error for a lock wait that passed lock_timeout. */
const LOCK_NOT_AVAILABLE = '55P03';

/** A billed path's refusal for want of money: whose it is, and how much the wallet lacked. */
export type Refused = { outcome: 'insufficient_balance'; payer: 'wallet' | 'merchant' };

/** What a wallet refusal asks auto top-up to buy for. */
export type ShortWallet = {
  /** The customer's wallet that pays the request. */
  walletId: string;
  /** What the wallet must have available for the request. */
  needed: bigint;
  /**
   * The request is on a meter linked to the plan of the customer's live subscription, as the
   * ledger decided it (BillingContext / the charge batch's own read); only such a request triggers
   * a purchase, since plan credit pays only such usage.
   */
  drawsPlanCredit: boolean;
  /** The holds this process admitted and has not written yet, which the admission counted (SQLite's deferred admission). */
  unwritten?: UnwrittenHolds | null;
};

/**
 * Runs a billed path's admission (or charge) and, while the customer's wallet cannot pay it and
 * auto top-up can make it able to, waits for holds in flight to settle or buys the subscription's
 * auto top-up bundle (once however many requests are short at the same time), and tries again: a
 * funded card never leaves a request refused that a purchase could cover, also when concurrent
 * requests take the credit first. The refusal is returned when there is nothing to buy: no auto
 * top-up bundle, a meter the plan does not link, the merchant's share refused, a declined payment,
 * a request larger than MAX_PURCHASES_PER_REQUEST bundles, or no progress after MAX_ROUNDS tries.
 * `shortWallet` reads the refusal for what to buy.
 */
export async function admitWithAutoTopUp<T extends { outcome: string }>(
  deps: PurchaseDeps,
  shortWallet: (refused: Extract<T, Refused>) => ShortWallet,
  attempt: () => Promise<T>,
): Promise<T> {
  let result = await attempt();
  let purchases = 0;
  for (let round = 0; round < MAX_ROUNDS && isWalletRefusal(result); round++) {
    const short = shortWallet(result);
    if (!short.drawsPlanCredit) return result;
    const step = await topUpIfShort(deps, short.walletId, short.needed, dateOf(deps.clock), short.unwritten ?? null);
    if (step === 'no_auto_top_up' || step === 'payment_failed' || step === 'cannot_cover') return result;
    if (step === 'bought' && ++purchases > MAX_PURCHASES_PER_REQUEST) return result;
    // Covered by the database's figures but refused: holds this process admitted and has not
    // written yet (SQLite's deferred admission) are being written; a moment later they count.
    if (step === 'covered' && round > 0) await pause(HOLD_POLL_MS);
    result = await attempt();
  }
  return result;
}

/** Tries of one request before its refusal stands; each waits for a settlement or a purchase. */
const MAX_ROUNDS = 20;

function isWalletRefusal<T extends { outcome: string }>(outcome: T): outcome is Extract<T, Refused> {
  return outcome.outcome === 'insufficient_balance' && (outcome as unknown as Refused).payer === 'wallet';
}

/**
 * How soon a caller short by holds looks at the wallet again: at first after HOLD_POLL_MS (most
 * calls settle within a few), then less and less often, up to every HOLD_POLL_MAX_MS for a long
 * call; and for how long at most, by the app's clock.
 */
const HOLD_POLL_MS = 10;
const HOLD_POLL_MAX_MS = 160;
export const HOLD_WAIT_MS = 30_000;

/** What requests in flight hold on a wallet: its hold rows, and this process's holds not written yet. */
const heldOn = (wallet: { id: string; held: bigint }, unwritten: UnwrittenHolds | null) => wallet.held + (unwritten ? unwritten.on(wallet.id) : 0n);

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Waits until the wallet's holds or balance move from `seen` (a request in flight settled, or was
 * released): true; false when nothing moved within HOLD_WAIT_MS (a call that long still running),
 * and the caller then buys, since a customer with a funded card is not refused. The callers
 * waiting on one wallet in this process share one look at it (CommerceState.holdWaits).
 */
async function holdsSettled(deps: PurchaseDeps, walletId: string, seen: { held: bigint; balance: bigint }, unwritten: UnwrittenHolds | null): Promise<boolean> {
  const waits = deps.commerceState.holdWaits;
  const key = `${walletId}:${seen.held}:${seen.balance}`;
  let wait = waits.get(key);
  if (!wait) {
    wait = watchWallet(deps, walletId, seen, unwritten).finally(() => waits.delete(key));
    waits.set(key, wait);
  }
  return wait;
}

/**
 * Looks at the wallet until its holds or balance move, or HOLD_WAIT_MS passed on the app's clock.
 * It looks rather than being told: a settlement is written by the ledger's writer, or by another
 * instance sharing the database, and nothing in this process hears of either.
 */
async function watchWallet(deps: PurchaseDeps, walletId: string, seen: { held: bigint; balance: bigint }, unwritten: UnwrittenHolds | null): Promise<boolean> {
  const since = deps.clock.now();
  for (let delay = HOLD_POLL_MS; deps.clock.now() - since < HOLD_WAIT_MS; delay = Math.min(delay * 2, HOLD_POLL_MAX_MS)) {
    await pause(delay);
    const row = await deps.storage.db.selectFrom('wallets').select(['id', 'held', 'balance']).where('id', '=', walletId).executeTakeFirstOrThrow();
    const wallet = { id: row.id, held: BigInt(row.held), balance: BigInt(row.balance) };
    if (heldOn(wallet, unwritten) !== seen.held || wallet.balance !== seen.balance) return true;
  }
  return false;
}
