/** Unique-constraint failures look different on each engine. */
export function isUniqueViolation(e: unknown): boolean {
  if (typeof e !== 'object' || e === null || !('code' in e)) return false;
  return e.code === '23505' || e.code === 'SQLITE_CONSTRAINT_UNIQUE';
}
