import type { Command } from 'commander';
import { readCredentials } from './credentials-file.ts';

/**
 * Merchant commands (`tollgate webhooks …`) go through the HTTP API with a secret key, as any
 * client would: the server applies the same checks, limits and idempotency as for everyone.
 */
export type ApiOptions = { apiUrl: string; secretKey?: string };

export const DEFAULT_API_URL = 'http://127.0.0.1:8080';

/**
 * A flag wins, then the environment, then what `tollgate login` stored (its key and the server it
 * came from), then the local default server.
 */
export function addApiOptions(command: Command): Command {
  const stored = process.env.TOLLGATE_SECRET_KEY ? undefined : readCredentials();
  return command
    .option('--api-url <url>', 'the Tollgate server (env TOLLGATE_API_URL, else the logged-in server)', process.env.TOLLGATE_API_URL || stored?.server || DEFAULT_API_URL)
    .option('--secret-key <key>', "the merchant's secret key (env TOLLGATE_SECRET_KEY, else tollgate login's)", process.env.TOLLGATE_SECRET_KEY || stored?.secret_key);
}

export class ApiCallError extends Error {}

/** Calls the API and returns its JSON, or throws an ApiCallError carrying the error envelope's message and code. */
export async function callApi(opts: ApiOptions, method: string, path: string, body?: object): Promise<unknown> {
  if (!opts.secretKey) throw new ApiCallError('Give --secret-key, set TOLLGATE_SECRET_KEY, or run tollgate login.');
  let res: Response;
  try {
    res = await fetch(new URL(`/v1/${path}`, opts.apiUrl), {
      method,
      headers: { authorization: `Bearer ${opts.secretKey}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      ...(body ? { body: JSON.stringify(body) } : {}),
    });
  } catch (e) {
    throw new ApiCallError(`Cannot reach ${opts.apiUrl}: ${(e as Error).cause instanceof Error ? ((e as Error).cause as Error).message : (e as Error).message}`);
  }
  const json = (await res.json().catch(() => null)) as { error?: { message: string; code: string } } | null;
  if (!res.ok) throw new ApiCallError(json?.error ? `${json.error.message} (${json.error.code})` : `HTTP ${res.status}`);
  return json;
}
