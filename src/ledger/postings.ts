import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database, LedgerPostingsTable, LedgerTransactionsTable } from '../storage/schema.ts';

export type Leg = { account: string; amount: bigint };

export type LedgerTransactionInput = {
  kind: string;
  merchantId: string;
  reference?: string;
  description?: string;
  legs: Leg[];
  at: string;
};

export class UnbalancedTransactionError extends Error {}

/**
 * Appends one ledger transaction. Every transaction balances: its legs sum to zero.
 * `reference` makes a (kind, reference) pair unique, so a request is settled at most once.
 */
export async function appendTransaction(trx: Transaction<Database>, input: LedgerTransactionInput): Promise<string> {
  const [id] = await appendTransactions(trx, [input]);
  return id!;
}

/** Several ledger transactions in two statements (one for the transactions, one for their legs). */
async function appendTransactions(trx: Transaction<Database>, inputs: LedgerTransactionInput[]): Promise<string[]> {
  if (inputs.length === 0) return [];
  const { transactions, postings } = ledgerRows(inputs);
  await trx.insertInto('ledger_transactions').values(transactions).execute();
  if (postings.length > 0) await trx.insertInto('ledger_postings').values(postings).execute();
  return transactions.map((t) => t.id);
}

/** The rows that record ledger transactions, with fresh ids; refuses any that does not balance. */
export function ledgerRows(inputs: LedgerTransactionInput[]): { transactions: LedgerTransactionsTable[]; postings: LedgerPostingsTable[] } {
  const transactions: LedgerTransactionsTable[] = [];
  const postings: LedgerPostingsTable[] = [];
  for (const input of inputs) {
    const legs = balancedLegs(input);
    const id = newId('transaction');
    transactions.push({
      id,
      kind: input.kind,
      merchant_id: input.merchantId,
      reference: input.reference ?? null,
      description: input.description ?? null,
      created_at: input.at,
    });
    for (const leg of legs) {
      postings.push({ id: newId('posting'), transaction_id: id, account: leg.account, amount: leg.amount, created_at: input.at });
    }
  }
  return { transactions, postings };
}

/** The legs worth writing (zero legs are dropped); refuses a transaction whose legs do not sum to zero. */
function balancedLegs(input: LedgerTransactionInput): Leg[] {
  const legs = input.legs.filter((l) => l.amount !== 0n);
  const sum = legs.reduce((acc, l) => acc + l.amount, 0n);
  if (sum !== 0n) throw new UnbalancedTransactionError(`ledger transaction ${input.kind} is off by ${sum}`);
  return legs;
}
