import type pg from 'pg';

/**
 * A transaction on a connection in pipeline mode (Storage.pipeline): BEGIN travels with the first
 * statement and COMMIT with the last, so a transaction of two statements costs two round trips.
 */
export type PipelinedTransaction = {
  /** Begins the transaction and runs its first statement; its rows. */
  begin<R>(text: string, values: unknown[]): Promise<R[]>;
  /**
   * Runs the last statement, if any, and commits. When the statement fails, PostgreSQL answers the
   * COMMIT sent behind it with a rollback, and the statement's error is thrown: nothing was written.
   */
  commit<R>(last?: { text: string; values: unknown[] }): Promise<R[]>;
};

/** Runs `work` in a pipelined transaction; rolled back if `work` throws before its commit. */
export async function inPipelinedTransaction<T>(pool: pg.Pool, work: (trx: PipelinedTransaction) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    return await work({
      begin: async <R>(text: string, values: unknown[]) => {
        const [, result] = await Promise.all([client.query('begin'), client.query(text, values)]);
        return result.rows as R[];
      },
      commit: async <R>(last?: { text: string; values: unknown[] }) => {
        const [statement, commit] = await Promise.allSettled([last ? client.query(last.text, last.values) : null, client.query('commit')]);
        if (statement.status === 'rejected') throw statement.reason;
        if (commit.status === 'rejected') throw commit.reason;
        if (commit.value.command !== 'COMMIT') throw new Error(`transaction ended by ${commit.value.command}, not COMMIT`);
        return (statement.value?.rows ?? []) as R[];
      },
    });
  } catch (error) {
    // A no-op after a commit that rolled back; ends the transaction when a statement failed before.
    await client.query('rollback').catch((e: unknown) => {
      broken = e instanceof Error ? e : new Error(String(e));
    });
    throw error;
  } finally {
    client.release(broken);
  }
}
