/**
 * What a wallet can pay, pure: its available balance, the plan-credit rule (which usage may draw
 * cycle and bundle credit, decision 0016) and how a debit splits across its buckets. Every
 * admission and charge path reads a wallet through these.
 */
import { BUCKET_ORDER, walletAccount, type Bucket } from '../accounts.ts';
import type { Leg } from '../postings.ts';
import type { WalletsTable } from '../../storage/schema.ts';

/** Holds a process admitted and has not written yet, by wallet (UnwrittenHolds); none on PostgreSQL. */
export type Unwritten = { on(walletId: string): bigint };

type Balances = Pick<WalletsTable, 'id' | 'balance' | 'held'>;
type Buckets = Balances & Pick<WalletsTable, 'cycle_credit' | 'bundle_credit'>;

/** What a wallet can still promise: its balance less what is held, in rows and in process. */
export const availableOf = (w: Balances, unwritten: Unwritten | null | undefined): bigint => w.balance - w.held - (unwritten ? unwritten.on(w.id) : 0n);

/** The plan credit (cycle and bundle) a wallet has. */
export const planCreditOf = (w: Pick<WalletsTable, 'cycle_credit' | 'bundle_credit'>): bigint => BigInt(w.cycle_credit) + BigInt(w.bundle_credit);

/**
 * Whether a request draws plan credit: only when its billing says so (the customer's live
 * subscription's plan links the meter); absent means prepaid only.
 */
export const drawsPlanCredit = (billing: { drawsPlanCredit?: boolean }): boolean => billing.drawsPlanCredit === true;

/**
 * What a request may still take from a wallet. Usage that draws plan credit may take all of it;
 * any other usage only the prepaid balance, against which every hold is counted, whichever bucket
 * it will be paid from: a conservative rule, since a hold does not know its bucket until it settles.
 */
export function availableFor(w: Buckets, unwritten: Unwritten | null | undefined, drawsPlan: boolean): bigint {
  const available = availableOf(w, unwritten);
  return drawsPlan ? available : available - planCreditOf(w);
}

/**
 * Splits a debit across buckets: in consumption order (cycle, bundle, prepaid) when it draws plan
 * credit, else all of it from the prepaid balance. Prepaid takes whatever is left, below zero if
 * need be (a settlement above its hold).
 */
export function splitDebit(wallet: Pick<WalletsTable, 'balance' | 'cycle_credit' | 'bundle_credit'>, amount: bigint, drawsPlan: boolean): Record<Bucket, bigint> {
  if (!drawsPlan) return { cycle: 0n, bundle: 0n, prepaid: amount };
  const prepaid = wallet.balance - wallet.cycle_credit - wallet.bundle_credit;
  const available: Record<Bucket, bigint> = { cycle: wallet.cycle_credit, bundle: wallet.bundle_credit, prepaid };
  const taken: Record<Bucket, bigint> = { cycle: 0n, bundle: 0n, prepaid: 0n };
  let rest = amount;
  for (const bucket of BUCKET_ORDER) {
    const take = bucket === 'prepaid' ? rest : rest < available[bucket] ? rest : available[bucket];
    taken[bucket] = take > 0n ? take : 0n;
    rest -= taken[bucket];
  }
  return taken;
}

/**
 * Takes `amount` out of a locked wallet's row in memory, bucket by bucket, and returns the ledger
 * legs that record it; the caller writes the row back before its transaction ends. The caller has
 * already checked the available balance.
 */
export function debitInMemory(wallet: WalletsTable, amount: bigint, drawsPlan: boolean): Leg[] {
  if (amount === 0n) return [];
  const split = splitDebit(wallet, amount, drawsPlan);
  wallet.balance -= amount;
  wallet.cycle_credit -= split.cycle;
  wallet.bundle_credit -= split.bundle;
  return BUCKET_ORDER.map((b) => ({ account: walletAccount(wallet.id, b), amount: -split[b] }));
}
