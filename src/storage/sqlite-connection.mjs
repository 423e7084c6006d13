// What every SQLite connection of the app shares: the one on the thread that serves requests
// (sqlite.ts) and the writer thread's (sqlite-writer-thread.mjs). Plain JavaScript, so the writer
// thread imports it without a TypeScript loader, from src/ as from dist/ (the build copies it);
// its types are in sqlite-connection.d.mts.

/** Settings of every connection: WAL, a writer waits for the lock, and exact money. */
export function configureConnection(db) {
  db.pragma('journal_mode = WAL');
  db.pragma('busy_timeout = 10000');
  db.pragma('synchronous = NORMAL');
  // Money is BIGINT; numbers above 2^53 must never pass through a JS number.
  db.defaultSafeIntegers(true);
}

/** The app issues a small, fixed set of SQL texts: each connection keeps this many prepared. */
export const STATEMENT_CACHE_SIZE = 500;

/** The text that marks a statement list (sqlite.ts, statementList). */
export const STATEMENT_LIST = '-- statement list';

/**
 * Runs a statement list's `{ sql, parameters }` in order, each prepared by `prepare`: one row
 * `{ returned }` per statement (how many rows it returned; 0 without RETURNING). A failing
 * statement throws, and the list stops there.
 */
export function runStatementList(prepare, list) {
  return list.map(({ sql, parameters }) => {
    const statement = prepare(sql);
    if (statement.reader) return { returned: statement.all(parameters).length };
    statement.run(parameters);
    return { returned: 0 };
  });
}
