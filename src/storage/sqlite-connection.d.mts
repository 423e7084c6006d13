import type SqliteDatabase from 'better-sqlite3';

export function configureConnection(db: SqliteDatabase.Database): void;
export const STATEMENT_CACHE_SIZE: number;
export const STATEMENT_LIST: string;
export type ListedStatement = { sql: string; parameters: unknown[] };
export function runStatementList(prepare: (sql: string) => SqliteDatabase.Statement, list: ListedStatement[]): { returned: number }[];
