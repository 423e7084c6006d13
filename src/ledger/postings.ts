import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database } from '../storage/schema.ts';

export type Leg = { account: string; amount: bigint };

export class UnbalancedTransactionError extends Error {}

/**
 * Appends one ledger transaction. Every transaction balances: its legs sum to zero.
 * `reference` makes a (kind, reference) pair unique, so a request is settled at most once.
 */
export async function appendTransaction(
  trx: Transaction<Database>,
  input: { kind: string; merchantId: string; reference?: string; description?: string; legs: Leg[]; at: string },
): Promise<string> {
  const legs = input.legs.filter((l) => l.amount !== 0n);
  const sum = legs.reduce((acc, l) => acc + l.amount, 0n);
  if (sum !== 0n) throw new UnbalancedTransactionError(`ledger transaction ${input.kind} is off by ${sum}`);
  const id = newId('transaction');
  await trx
    .insertInto('ledger_transactions')
    .values({
      id,
      kind: input.kind,
      merchant_id: input.merchantId,
      reference: input.reference ?? null,
      description: input.description ?? null,
      created_at: input.at,
    })
    .execute();
  if (legs.length > 0) {
    await trx
      .insertInto('ledger_postings')
      .values(legs.map((l) => ({ id: newId('posting'), transaction_id: id, account: l.account, amount: l.amount, created_at: input.at })))
      .execute();
  }
  return id;
}
