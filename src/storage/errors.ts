/** Unique-constraint failures look different on each engine. */
export function isUniqueViolation(e: unknown): boolean {
  if (typeof e !== 'object' || e === null || !('code' in e)) return false;
  return e.code === '23505' || e.code === 'SQLITE_CONSTRAINT_UNIQUE';
}

/** Node's socket failures: the server refused, reset, or cannot be found. */
const UNREACHABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN']);
/** PostgreSQL's own: terminated by an administrator or a crash, starting up, out of connections. */
const UNAVAILABLE_SQLSTATES = new Set(['57P01', '57P02', '57P03', '53300']);
/** node-postgres reports a lost or unobtainable connection in plain messages, without a code. */
const UNAVAILABLE_MESSAGE =
  /^(Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable|Connection terminated due to connection timeout)/;

/**
 * True when an error says the database could not be reached or dropped the connection: an outage
 * to retry after (503), not a fault of the request or the code. Node reports a refused connection
 * to a name with several addresses as an AggregateError of the attempts.
 */
export function isDatabaseUnavailable(e: unknown): boolean {
  if (typeof e !== 'object' || e === null) return false;
  const { code, message, errors } = e as { code?: unknown; message?: unknown; errors?: unknown };
  if (typeof code === 'string' && (UNREACHABLE_CODES.has(code) || UNAVAILABLE_SQLSTATES.has(code) || code.startsWith('08'))) return true;
  if (typeof message === 'string' && UNAVAILABLE_MESSAGE.test(message)) return true;
  return Array.isArray(errors) && errors.some(isDatabaseUnavailable);
}
