/**
 * Ledger statements both engines run with the same text. The rules they write by are decided
 * elsewhere (decide/, and postings.ts for what a balanced transaction is); this file only writes.
 */
import type { Transaction } from 'kysely';
import type { Database } from '../../storage/schema.ts';
import { ledgerRows, type LedgerTransactionInput } from '../postings.ts';

/**
 * Appends one ledger transaction, in two statements (the transaction, then its legs). Every
 * transaction balances: its legs sum to zero (ledgerRows checks). `reference` makes a (kind,
 * reference) pair unique, so a request is settled at most once.
 */
export async function appendTransaction(trx: Transaction<Database>, input: LedgerTransactionInput): Promise<string> {
  const { transactions, postings } = ledgerRows([input]);
  await trx.insertInto('ledger_transactions').values(transactions).execute();
  if (postings.length > 0) await trx.insertInto('ledger_postings').values(postings).execute();
  return transactions[0]!.id;
}
