/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * The database backs the ledger's invariants, so a bug (or a hand-edit) cannot quietly break
 * them: postings and ledger transactions are append-only; on PostgreSQL a transaction whose
 * postings do not sum to zero cannot commit; bucket credit never goes below zero; a posting is
 * never zero; a request's costs are never negative and its provider key type is one Tollgate
 * records. PostgreSQL gets CHECK constraints; SQLite cannot add a CHECK to an existing table,
 * so there triggers refuse the same rows.
 */
import { PostgresAdapter, sql, type Kysely } from 'kysely';

const APPEND_ONLY = ['ledger_transactions', 'ledger_postings'] as const;

const REQUEST_COSTS = [
  'input_cost',
  'output_cost',
  'fee_amount',
  'service_charge_amount',
  'total_request_cost',
  'total_wallet_cost',
  'total_merchant_cost',
] as const;

/**
 * Row checks: each condition written for a row prefix ('' in a CHECK, 'new.' in a SQLite
 * trigger), over the columns it reads. Constants only, so they are spliced in as SQL text.
 */
const ROW_CHECKS: { name: string; table: string; columns: readonly string[]; condition: (row: string) => string }[] = [
  { name: 'wallets_cycle_credit_nonnegative', table: 'wallets', columns: ['cycle_credit'], condition: (r) => `${r}cycle_credit >= 0` },
  { name: 'wallets_bundle_credit_nonnegative', table: 'wallets', columns: ['bundle_credit'], condition: (r) => `${r}bundle_credit >= 0` },
  { name: 'ledger_postings_amount_nonzero', table: 'ledger_postings', columns: ['amount'], condition: (r) => `${r}amount <> 0` },
  {
    name: 'requests_costs_nonnegative',
    table: 'requests',
    columns: REQUEST_COSTS,
    condition: (r) => REQUEST_COSTS.map((c) => `${r}${c} >= 0`).join(' and '),
  },
  {
    name: 'requests_provider_key_type_known',
    table: 'requests',
    columns: ['provider_key_type'],
    condition: (r) => `${r}provider_key_type in ('managed', 'unmanaged')`,
  },
];

export async function up(db: Kysely<unknown>): Promise<void> {
  if (db.getExecutor().adapter instanceof PostgresAdapter) await postgres(db);
  else await sqlite(db);
}

async function postgres(db: Kysely<unknown>): Promise<void> {
  await sql`
    create function tollgate_refuse_ledger_change() returns trigger language plpgsql as $$
    begin
      raise exception '% is append-only: % refused', tg_table_name, tg_op using errcode = 'restrict_violation';
    end $$`.execute(db);
  for (const table of APPEND_ONLY) {
    await sql`
      create trigger ${sql.raw(`${table}_append_only`)} before update or delete on ${sql.table(table)}
      for each row execute function tollgate_refuse_ledger_change()`.execute(db);
    await sql`
      create trigger ${sql.raw(`${table}_no_truncate`)} before truncate on ${sql.table(table)}
      for each statement execute function tollgate_refuse_ledger_change()`.execute(db);
  }

  // Checked at commit, when every leg of the transaction is in (they arrive in separate rows,
  // sometimes separate statements).
  await sql`
    create function tollgate_ledger_transaction_balances() returns trigger language plpgsql as $$
    declare
      total numeric;
    begin
      select coalesce(sum(amount), 0) into total from ledger_postings where transaction_id = new.transaction_id;
      if total <> 0 then
        raise exception 'ledger transaction % does not balance: its postings sum to %', new.transaction_id, total
          using errcode = 'check_violation';
      end if;
      return null;
    end $$`.execute(db);
  await sql`
    create constraint trigger ledger_postings_balance after insert on ledger_postings
    deferrable initially deferred
    for each row execute function tollgate_ledger_transaction_balances()`.execute(db);

  for (const check of ROW_CHECKS) {
    await sql`alter table ${sql.table(check.table)} add constraint ${sql.raw(check.name)} check (${sql.raw(check.condition(''))})`.execute(db);
  }
}

async function sqlite(db: Kysely<unknown>): Promise<void> {
  for (const table of APPEND_ONLY) {
    for (const op of ['update', 'delete'] as const) {
      await sql`
        create trigger ${sql.raw(`${table}_no_${op}`)} before ${sql.raw(op)} on ${sql.table(table)}
        begin select raise(abort, ${sql.lit(`${table} is append-only: ${op} refused`)}); end`.execute(db);
    }
  }
  for (const check of ROW_CHECKS) {
    const refuse = sql`begin select raise(abort, ${sql.lit(`${check.name}: check failed on ${check.table}`)}); end`;
    await sql`
      create trigger ${sql.raw(`${check.name}_insert`)} before insert on ${sql.table(check.table)}
      when not (${sql.raw(check.condition('new.'))}) ${refuse}`.execute(db);
    await sql`
      create trigger ${sql.raw(`${check.name}_update`)} before update of ${sql.raw(check.columns.join(', '))} on ${sql.table(check.table)}
      when not (${sql.raw(check.condition('new.'))}) ${refuse}`.execute(db);
  }
}

