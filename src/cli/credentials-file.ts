import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';

/** What `tollgate login` keeps: the server it logged in to and the secret key it was given. */
export type StoredCredentials = {
  server: string;
  merchant_id: string;
  wallet_id: string;
  secret_key_id: string;
  secret_key: string;
};

/** `$XDG_CONFIG_HOME/tollgate/credentials.json`, else `~/.config/tollgate/credentials.json`. */
export function credentialsPath(env: NodeJS.ProcessEnv = process.env): string {
  const base = env.XDG_CONFIG_HOME || join(homedir(), '.config');
  return join(base, 'tollgate', 'credentials.json');
}

export function readCredentials(path = credentialsPath()): StoredCredentials | undefined {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
  try {
    const parsed = JSON.parse(text) as Partial<StoredCredentials>;
    return typeof parsed.secret_key === 'string' && typeof parsed.server === 'string' ? (parsed as StoredCredentials) : undefined;
  } catch {
    return undefined;
  }
}

/** Written readable by its owner only (0600), in a directory only its owner can enter. */
export function writeCredentials(credentials: StoredCredentials, path = credentialsPath()): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  writeFileSync(path, `${JSON.stringify(credentials, null, 2)}\n`, { mode: 0o600 });
  // writeFileSync's mode applies only when it creates the file; an older file is tightened too.
  chmodSync(path, 0o600);
}

export function removeCredentials(path = credentialsPath()): boolean {
  try {
    rmSync(path);
    return true;
  } catch {
    return false;
  }
}
