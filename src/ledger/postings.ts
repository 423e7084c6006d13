import { newId } from '../domain/ids.ts';
import type { LedgerPostingsTable, LedgerTransactionsTable } from '../storage/schema.ts';

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
