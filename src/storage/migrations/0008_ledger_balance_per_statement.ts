/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * The zero-sum check of ledger transactions (0005) ran once per posting, deferred to commit: a
 * request's charge has two or three postings, so a batch of charges paid for dozens of trigger
 * calls and index probes inside its COMMIT. Every writer appends a transaction's postings in one
 * statement, so the check now runs once per statement, right after it, over every transaction the
 * statement touched (all of each one's postings, earlier ones included). That is at least as
 * strict: no statement can leave a ledger transaction that does not sum to zero. PostgreSQL only,
 * as before (SQLite has no deferred or statement-level row checks; the application's own check,
 * ledgerRows, guards both engines).
 */
import { PostgresAdapter, sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  if (!(db.getExecutor().adapter instanceof PostgresAdapter)) return;
  await sql`drop trigger ledger_postings_balance on ledger_postings`.execute(db);
  await sql`drop function tollgate_ledger_transaction_balances()`.execute(db);
  await sql`
    create function tollgate_ledger_transactions_balance() returns trigger language plpgsql as $$
    declare
      unbalanced record;
    begin
      -- One index probe per transaction touched (a lateral sum, so the planner cannot choose to
      -- scan the whole postings table for a statement of unknown size).
      select touched.transaction_id, sums.total into unbalanced
      from (select distinct transaction_id from new_postings) touched
      cross join lateral (select sum(p.amount) as total from ledger_postings p where p.transaction_id = touched.transaction_id) sums
      where sums.total <> 0
      limit 1;
      if found then
        raise exception 'ledger transaction % does not balance: its postings sum to %', unbalanced.transaction_id, unbalanced.total
          using errcode = 'check_violation';
      end if;
      return null;
    end $$`.execute(db);
  await sql`
    create trigger ledger_postings_balance after insert on ledger_postings
    referencing new table as new_postings
    for each statement execute function tollgate_ledger_transactions_balance()`.execute(db);
}
