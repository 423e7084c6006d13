import { z } from 'zod';
import { ApiError } from './errors.ts';

const DEFAULT_PAGE_SIZE = 10;
const MAX_PAGE_SIZE = 100;

/** Query schema shared by every list endpoint. */
export const pageQuery = z.object({
  cursor: z.string().min(1).max(100).optional(),
  limit: z.coerce
    .number({ error: 'limit must be an integer between 1 and 100' })
    .int('limit must be an integer between 1 and 100')
    .min(1, 'limit must be between 1 and 100')
    .max(MAX_PAGE_SIZE, 'limit must be between 1 and 100')
    .default(DEFAULT_PAGE_SIZE),
});

export type PageQuery = z.infer<typeof pageQuery>;

export type Page<T> = { data: T[]; has_more: boolean; next_cursor: string | null };

/**
 * Builds the page from rows fetched with `limit + 1`: the extra row only tells whether more exist.
 * Lists are newest first and ids sort by creation time, so the cursor is the last id shown.
 */
export function toPage<R extends { id: string }, T>(rows: R[], limit: number, present: (row: R) => T): Page<T> {
  const hasMore = rows.length > limit;
  const shown = hasMore ? rows.slice(0, limit) : rows;
  const last = shown[shown.length - 1];
  return { data: shown.map(present), has_more: hasMore, next_cursor: hasMore && last ? last.id : null };
}

export const pageResponse = <T extends z.ZodType>(item: T) =>
  z.object({ data: z.array(item), has_more: z.boolean(), next_cursor: z.string().nullable() });

/** A cursor must name an item of the list it pages through; anything else is a clear 400. */
export async function assertCursor(
  cursor: string | undefined,
  exists: (id: string) => Promise<boolean>,
): Promise<void> {
  if (cursor === undefined) return;
  if (!(await exists(cursor))) {
    throw new ApiError('invalid_cursor', `The cursor ${cursor} does not name an item of this list.`, {
      issues: [{ path: ['cursor'], message: 'does not name an item of this list' }],
    });
  }
}
