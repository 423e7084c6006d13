/**
 * Wallet leases (decision 0013). On PostgreSQL every admission used to cost a round trip and a
 * durable commit on the response path. An instance serving many requests from one wallet now
 * reserves a slice of it once — a hold row of its own, whose reference is its own id — and admits
 * those requests from the slice in process. Other instances and POST /requests see the slice as
 * held, exactly like any hold, so the wallet is never promised twice.
 *
 * A request taken from a lease is written later, as on SQLite (decision 0011): its settlement
 * moves its share out of the lease row (`amount` down, wallet `held` down), or, when it runs long,
 * its own hold row is carved out of the lease. A lease unused for a while, or at shutdown, is given
 * back; a lease whose instance died expires with its own short lifetime (WALLET_LEASE_TTL_MS,
 * decision 0019).
 */
import type { Transaction } from 'kysely';
import { dateOf, type Clock } from '../domain/clock.ts';
import type { Database } from '../storage/schema.ts';
import type { FastifyBaseLogger } from 'fastify';
import { newId } from '../domain/ids.ts';
import type { HoldKeeper } from './hold-keeper.ts';
import type { Storage } from '../storage/db.ts';
import { releaseHold } from './holds.ts';
import { lockWallets } from './wallets.ts';
import { leaseGrant } from './decide/admission.ts';

/**
 * A lease is sized by time, not by count: a top-up asks for about this long of the wallet's
 * admissions, at the rate the lease saw since its previous top-up, and never for fewer than
 * MIN_REQUESTS_PER_TOP_UP requests' shares. At a few thousand admissions a second a fixed 64 shares
 * lasted ~10 ms, and the refill started ~3 ms before the lease ran dry, less than a top-up takes
 * while a settlement batch holds the wallet's lock: admissions then waited on the response path.
 */
const TOP_UP_COVERS_MS = 100;
/** A lease with about this long of admissions left is topped up in the background. */
const REFILL_LEAD_MS = 25;
/** A top-up asks for at least this many times the request's share, so most requests find the slice ready. */
const MIN_REQUESTS_PER_TOP_UP = 64;
/**
 * A lease with less than this many times the request's share left is topped up in the background
 * (or sooner, at a high rate: REFILL_LEAD_MS), so admissions keep taking from what is left instead
 * of waiting for the top-up's transaction (which waits in turn for a settlement holding the
 * wallet's lock).
 */
const MIN_REFILL_BELOW_REQUESTS = 16;
/** A bound on one top-up however fast the wallet's requests come (each top-up is also capped by decide/admission.ts MAX_SHARE_OF_AVAILABLE). */
const MAX_REQUESTS_PER_TOP_UP = 4096;
/** A wallet is hot after more than `hotAfter` admissions within this long of the first one counted. */
const HOT_WINDOW_MS = 1000;

export type Lease = {
  /** The lease's hold row. */
  readonly holdId: string;
  readonly walletId: string;
  /** What admissions may still take from it. */
  free: bigint;
  /** Admissions taken from it whose share is still in the lease row (unsettled and not written). */
  inFlight: number;
  lastUsed: number;
  /** Given back, or found expired: nothing more is taken from it. */
  retired: boolean;
  /** Admissions taken since the last top-up began, and when it began: the lease's rate. */
  takenSinceTopUp: number;
  topUpStartedAt: number;
  /** Requests' shares the next top-up asks for (see refillBelowRequests for when it starts). */
  requestsPerTopUp: number;
};

export type LeaseOptions = { hotAfter: number; idleMs: number; ttlMs: number };

export class WalletLeases {
  readonly #storage: Storage;
  readonly #keeper: HoldKeeper;
  readonly #options: LeaseOptions;
  readonly #log: Pick<FastifyBaseLogger, 'warn'>;
  readonly #leases = new Map<string, Lease>();
  readonly #topUps = new Map<string, Promise<boolean>>();
  /** Admissions per wallet in its current window: what makes a wallet hot. */
  readonly #hits = new Map<string, { since: number; count: number }>();
  /**
   * Wallets found with plan credit (cycle, bundle), until when they are not leased: only usage on
   * a meter the customer's plan links may draw that credit, and a lease cannot tell whose share is
   * whose (decision 0016), so their admissions are decided in the database. A lease taken while a
   * wallet had no plan credit holds prepaid money only, which any usage may take.
   */
  readonly #withPlanCredit = new Map<string, number>();
  readonly #releases = new Set<Promise<void>>();
  readonly #released = new WeakSet<Lease>();
  readonly #timer: NodeJS.Timeout;
  readonly #clock: Clock;

  constructor(storage: Storage, keeper: HoldKeeper, options: LeaseOptions, log: Pick<FastifyBaseLogger, 'warn'>, clock: Clock) {
    this.#storage = storage;
    this.#clock = clock;
    this.#keeper = keeper;
    this.#options = options;
    this.#log = log;
    this.#timer = setInterval(() => this.#retireIdle(), Math.max(5, Math.floor(options.idleMs / 2)));
    this.#timer.unref();
  }

  /**
   * Counts an admission on these wallets; true when every one of them is hot (or already leased),
   * so the admission is served from leases.
   */
  serves(walletIds: readonly string[]): boolean {
    const now = this.#clock.now();
    let hot = walletIds.length > 0;
    for (const walletId of walletIds) {
      const planCreditUntil = this.#withPlanCredit.get(walletId);
      if (planCreditUntil !== undefined && planCreditUntil > now) return false;
      if (planCreditUntil !== undefined) this.#withPlanCredit.delete(walletId);
      let hits = this.#hits.get(walletId);
      if (!hits || now - hits.since >= HOT_WINDOW_MS) {
        if (this.#hits.size > 10_000) this.#forgetOldHits(now);
        hits = { since: now, count: 0 };
        this.#hits.set(walletId, hits);
      }
      hits.count += 1;
      if (hits.count <= this.#options.hotAfter && !this.#leases.has(walletId)) hot = false;
    }
    return hot;
  }

  /**
   * Takes each part from its wallet's lease (one part per wallet), all of them or none. Leases
   * short of their part are topped up (or opened) in the database first, taking nothing; the parts
   * are taken together, in one step, once every lease covers its own. So a request refused on one
   * wallet never holds another wallet's slice, even for the moment another admission could see it
   * and be refused where the reference admits (decision 0019). Returns the leases taken from, by
   * wallet, or the part whose wallet cannot cover it (nothing taken).
   */
  async takeAll<P extends { walletId: string; amount: bigint }>(parts: readonly P[]): Promise<Map<string, Lease> | P> {
    for (;;) {
      const short = parts.find((part) => !this.#covers(part.walletId, part.amount));
      if (!short) return new Map(parts.map((part) => [part.walletId, this.#takeCovered(part.walletId, part.amount)]));
      if (!(await this.#makeRoom(short.walletId, short.amount))) return short;
    }
  }

  /** takeAll for one wallet: the lease taken from, or null when the wallet cannot cover `amount`. */
  async take(walletId: string, amount: bigint): Promise<Lease | null> {
    const taken = await this.takeAll([{ walletId, amount }]);
    return taken instanceof Map ? taken.get(walletId)! : null;
  }

  /** Whether the wallet's lease can give `amount` now (a lease found expired is dropped: a new one replaces it). */
  #covers(walletId: string, amount: bigint): boolean {
    let lease = this.#leases.get(walletId);
    if (lease?.retired) {
      // Found expired by a write (markLeaseLost): a new lease replaces it.
      this.#retire(lease);
      lease = undefined;
    }
    if (lease) lease.lastUsed = this.#clock.now();
    return lease !== undefined && lease.free >= amount && lease.free > 0n;
  }

  /** Takes `amount` from a lease #covers just found able to give it. */
  #takeCovered(walletId: string, amount: bigint): Lease {
    const lease = this.#leases.get(walletId)!;
    lease.free -= amount;
    lease.inFlight += 1;
    lease.takenSinceTopUp += 1;
    if (lease.free < amount * BigInt(refillBelowRequests(lease))) this.#refill(walletId, amount);
    return lease;
  }

  /**
   * Makes the wallet's lease able to give `amount`: waits for its top-up under way (then the caller
   * looks again at what it left), or tops it up by what it lacks. False when the wallet cannot
   * cover it.
   */
  async #makeRoom(walletId: string, amount: bigint): Promise<boolean> {
    // One top-up per wallet at a time.
    const pending = this.#topUps.get(walletId);
    if (pending) {
      await pending.catch(() => false);
      return true;
    }
    return this.#startTopUp(walletId, amount - (this.#leases.get(walletId)?.free ?? 0n), amount);
  }

  /**
   * Tops a running-low lease up while admissions still take from it. Nothing is needed yet, so a
   * wallet with nothing more available is simply not topped up (its next admission that finds the
   * lease short is refused as usual), and a failure is only logged.
   */
  #refill(walletId: string, amount: bigint): void {
    if (this.#topUps.has(walletId)) return;
    this.#startTopUp(walletId, 0n, amount).catch((err: unknown) =>
      this.#log.warn({ err, walletId }, 'a wallet lease could not be topped up in the background'),
    );
  }

  /** Starts the wallet's one top-up, asking for `need` at least and for the lease's size in shares of `share`. */
  #startTopUp(walletId: string, need: bigint, share: bigint): Promise<boolean> {
    const lease = this.#leases.get(walletId);
    if (lease) sizeByRate(lease, this.#clock.now());
    const topUp = this.#topUp(walletId, need, share * BigInt(lease?.requestsPerTopUp ?? MIN_REQUESTS_PER_TOP_UP)).finally(() => this.#topUps.delete(walletId));
    this.#topUps.set(walletId, topUp);
    return topUp;
  }

  /** An admission taken from the lease did not go ahead: its share goes back. */
  giveBack(lease: Lease, amount: bigint): void {
    if (!lease.retired) lease.free += amount;
    this.end(lease);
  }

  /** The share of an admission taken from the lease has left the lease row (settled or written). */
  end(lease: Lease): void {
    lease.inFlight -= 1;
    if (lease.retired && lease.inFlight === 0) this.#release(lease);
  }

  /** Gives every lease back (shutdown, after every settlement was written). */
  async close(): Promise<void> {
    clearInterval(this.#timer);
    await Promise.allSettled([...this.#topUps.values()]);
    for (const lease of [...this.#leases.values()]) this.#retire(lease);
    while (this.#releases.size > 0) await Promise.allSettled([...this.#releases]);
  }

  /**
   * Raises the wallet's lease by at least `need` (by `want` when the wallet has plenty), opening
   * the lease when there is none; false when the wallet's available balance cannot cover `need`
   * or is not above zero, or it has plan credit (then its lease, if any, is retired).
   */
  async #topUp(walletId: string, need: bigint, want: bigint): Promise<boolean> {
    const current = this.#leases.get(walletId);
    const now = dateOf(this.#clock);
    try {
      const opened = current ? null : newId('hold');
      const granted = await this.#storage.db.transaction().execute(async (trx) => {
        const wallet = (await lockWallets(trx, this.#storage.dialect, [walletId])).get(walletId);
        if (!wallet) return 0n;
        // A dead instance's lease is given back as soon as its lifetime is over, not at the next sweep.
        wallet.held -= await releaseDueLeases(trx, walletId, now, current?.holdId);
        // The rule is the admission's (decide/admission.ts leaseGrant); a wallet with plan credit
        // is not leased (decision 0016): see #withPlanCredit.
        const grant = leaseGrant(wallet, need, want, current?.free ?? 0n);
        if ('refused' in grant) return grant.refused === 'plan_credit' ? PLAN_CREDIT : 0n;
        const amount = grant.amount;
        const expiresAt = new Date(now.getTime() + this.#options.ttlMs).toISOString();
        if (current) {
          const grown = await trx
            .updateTable('holds')
            .set((eb) => ({ amount: eb('amount', '+', amount), expires_at: expiresAt }))
            .where('id', '=', current.holdId)
            .where('status', '=', 'active')
            .returning('id')
            .executeTakeFirst();
          if (!grown) throw new LeaseLost();
        } else {
          await trx
            .insertInto('holds')
            .values({ id: opened!, wallet_id: walletId, reference: opened!, amount, status: 'active', created_at: now.toISOString(), expires_at: expiresAt })
            .execute();
        }
        await trx
          .updateTable('wallets')
          .set({ held: wallet.held + amount, overrun: grant.endsOverrun ? 0 : Number(wallet.overrun) })
          .where('id', '=', walletId)
          .execute();
        return amount;
      });
      if (granted === PLAN_CREDIT) {
        this.#withPlanCredit.set(walletId, this.#clock.now() + HOT_WINDOW_MS);
        if (current) this.#retire(current);
        return false;
      }
      if (granted === 0n) return false;
      const lease = opened ? this.#open(opened, walletId) : current!;
      lease.free += granted;
      return true;
    } catch (error) {
      // A lease found expired is replaced by a new one on the next look.
      if (current) this.#retire(current);
      if (error instanceof LeaseLost) return true;
      throw error;
    }
  }

  /** A new lease row is committed: admissions take from it from now on, and it is renewed. */
  #open(holdId: string, walletId: string): Lease {
    const now = this.#clock.now();
    const lease: Lease = {
      holdId,
      walletId,
      free: 0n,
      inFlight: 0,
      lastUsed: now,
      retired: false,
      takenSinceTopUp: 0,
      topUpStartedAt: now,
      requestsPerTopUp: MIN_REQUESTS_PER_TOP_UP,
    };
    this.#leases.set(walletId, lease);
    this.#keeper.add([holdId]);
    return lease;
  }

  /** Nothing more is taken from the lease; its row is given back once no admission's share is in it. */
  #retire(lease: Lease): void {
    lease.retired = true;
    lease.free = 0n;
    if (this.#leases.get(lease.walletId) === lease) this.#leases.delete(lease.walletId);
    if (lease.inFlight === 0) this.#release(lease);
  }

  /** Gives the whole lease row back, whatever it still holds (shares written or settled have left it). */
  #release(lease: Lease): void {
    if (this.#released.has(lease)) return;
    this.#released.add(lease);
    this.#keeper.delete([lease.holdId]);
    const release = releaseHold(this.#storage, lease.holdId)
      .then(() => undefined)
      .catch((err: unknown) => this.#log.warn({ err, holdId: lease.holdId }, 'could not give a wallet lease back; it expires with its TTL'))
      .finally(() => this.#releases.delete(release));
    this.#releases.add(release);
  }

  #retireIdle(): void {
    const idleSince = this.#clock.now() - this.#options.idleMs;
    for (const lease of [...this.#leases.values()]) {
      if (lease.retired || (lease.lastUsed < idleSince && !this.#topUps.has(lease.walletId))) this.#retire(lease);
    }
  }

  #forgetOldHits(now: number): void {
    for (const [walletId, hits] of this.#hits) if (now - hits.since >= HOT_WINDOW_MS) this.#hits.delete(walletId);
    for (const [walletId, until] of this.#withPlanCredit) if (until <= now) this.#withPlanCredit.delete(walletId);
  }
}

/**
 * Sizes the lease's next top-up by the admissions it saw since its previous top-up began: enough
 * for TOP_UP_COVERS_MS of them, refilled when about REFILL_LEAD_MS of them are left, within the
 * bounds (at a low rate, 64 shares refilled at 16, as before rates counted).
 */
export function sizeByRate(lease: Lease, now: number): void {
  const perSecond = (lease.takenSinceTopUp * 1000) / Math.max(1, now - lease.topUpStartedAt);
  lease.requestsPerTopUp = Math.min(MAX_REQUESTS_PER_TOP_UP, Math.max(MIN_REQUESTS_PER_TOP_UP, Math.ceil((perSecond * TOP_UP_COVERS_MS) / 1000)));
  lease.takenSinceTopUp = 0;
  lease.topUpStartedAt = now;
}

/**
 * The requests' shares left below which the lease is topped up in the background: the same share
 * of a top-up at every rate, so a lease just topped up is never already due for another.
 */
export function refillBelowRequests(lease: Pick<Lease, 'requestsPerTopUp'>): number {
  return Math.max(MIN_REFILL_BELOW_REQUESTS, Math.ceil((lease.requestsPerTopUp * REFILL_LEAD_MS) / TOP_UP_COVERS_MS));
}

/**
 * A write found the lease row no longer active (it expired): nothing more is taken from it, and
 * the next admission on its wallet opens a new lease.
 */
export function markLeaseLost(lease: Lease): void {
  lease.retired = true;
  lease.free = 0n;
}

/**
 * Gives back the wallet's leases whose lifetime ended unrenewed (their instance died or lost the
 * database for that long), inside the caller's transaction with the wallet locked; what they held.
 * `except`: this instance's own lease, which its top-up is about to raise.
 */
async function releaseDueLeases(trx: Transaction<Database>, walletId: string, now: Date, except?: string): Promise<bigint> {
  const due = await trx
    .updateTable('holds')
    .set({ status: 'expired' })
    .where('wallet_id', '=', walletId)
    .where('status', '=', 'active')
    .where('expires_at', '<=', now.toISOString())
    .whereRef('reference', '=', 'id')
    .$call((q) => (except ? q.where('id', '!=', except) : q))
    .returning('amount')
    .execute();
  const amount = due.reduce((sum, hold) => sum + BigInt(hold.amount), 0n);
  if (amount > 0n) {
    await trx
      .updateTable('wallets')
      .set((eb) => ({ held: eb('held', '-', amount) }))
      .where('id', '=', walletId)
      .execute();
  }
  return amount;
}

/** A top-up's answer for a wallet with plan credit: no lease (WalletLeases.#withPlanCredit). */
const PLAN_CREDIT = -1n;

/** The lease row was no longer active when a top-up tried to raise it. */
class LeaseLost extends Error {}
