// The SQLite writer thread (decision 0011, "Writes off the event loop"): it owns the connection that
// writes, so every write statement, every commit and every WAL checkpoint runs here and never on the
// thread that serves requests. Plain JavaScript, so it starts without a TypeScript loader, from
// src/ as from dist/ (the build copies it). The other side is sqlite-writer.ts.
//
// Messages in: { id, sql, parameters } runs one statement, or, when sql is STATEMENT_LIST, each
// { sql, parameters } of `parameters` in order (sqlite.ts, statementList); { release: true } ends a
// transaction its owner left open (rolled back); { close: true } closes the connection and ends
// the thread. Messages out: { id, rows } for a statement that returns rows (for a list, one row
// { returned } per statement: how many rows it returned), { id, changes, lastInsertRowid } for one
// that does not, { id, error: { message, code } } when it failed (a list stops at the failure).
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { configureConnection, runStatementList, STATEMENT_CACHE_SIZE, STATEMENT_LIST } from './sqlite-connection.mjs';

const { path, autocheckpointPages, cacheKib } = workerData;
const db = new Database(path);
configureConnection(db);
// SQLite checkpoints after a commit that leaves the WAL longer than this (a PASSIVE checkpoint: it
// never waits for readers). Only this connection commits, so every checkpoint runs on this thread.
db.pragma(`wal_autocheckpoint = ${autocheckpointPages}`);
db.pragma('foreign_keys = ON');
// Smaller than better-sqlite3's 16 MB default: the writer's hot pages are few (sqlite.ts, WRITER_CACHE_KIB).
db.pragma(`cache_size = -${cacheKib}`);

/** Each text is prepared once (as on the reading connection). */
const statements = new Map();

function prepare(sql) {
  let statement = statements.get(sql);
  if (!statement) {
    statement = db.prepare(sql);
    if (statements.size >= STATEMENT_CACHE_SIZE) statements.delete(statements.keys().next().value);
    statements.set(sql, statement);
  }
  return statement;
}

parentPort.on('message', (message) => {
  if (message.close) {
    db.close();
    parentPort.close();
    return;
  }
  if (message.release) {
    if (db.inTransaction) db.exec('rollback');
    return;
  }
  const { id, sql, parameters } = message;
  let reply;
  try {
    if (sql === STATEMENT_LIST) reply = { id, rows: runStatementList(prepare, parameters) };
    else {
      const statement = prepare(sql);
      if (statement.reader) reply = { id, rows: statement.all(parameters) };
      else {
        const { changes, lastInsertRowid } = statement.run(parameters);
        reply = { id, changes, lastInsertRowid };
      }
    }
  } catch (error) {
    reply = { id, error: { message: String(error?.message ?? error), code: error?.code } };
  }
  parentPort.postMessage(reply);
});
