import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Command } from 'commander';
import { ApiCallError, callApi, DEFAULT_API_URL } from './api-client.ts';
import { credentialsPath, readCredentials, removeCredentials, writeCredentials } from './credentials-file.ts';

const LOGIN_TIMEOUT_MS = 120_000;

/** The merchant pressed Cancel on the approval page. */
class LoginRefusedError extends Error {
  constructor() {
    super('Login cancelled in the browser; no key was created. Run tollgate login again to retry.');
  }
}

/** Answers the browser's redirect to the loopback listener: the code, once the state matches. */
function waitForCode(state: string, onListening: (port: number) => void): Promise<string> {
  return new Promise((resolve, reject) => {
    const server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const url = new URL(req.url ?? '/', 'http://127.0.0.1');
      if (req.method !== 'GET' || url.pathname !== '/callback') {
        res.writeHead(404).end('Not found');
        return;
      }
      const code = url.searchParams.get('code');
      const refused = url.searchParams.get('error');
      if (url.searchParams.get('state') !== state || (!code && !refused)) {
        res.writeHead(400, { 'content-type': 'text/plain; charset=utf-8' }).end('This login link does not belong to this command.');
        return;
      }
      if (refused || !code) {
        res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' }).end('Tollgate CLI: login cancelled. No key was created; you can close this tab.');
        finish(() => reject(new LoginRefusedError()));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' }).end('Tollgate CLI: logged in. You can close this tab.');
      finish(() => resolve(code));
    });
    const timer = setTimeout(() => finish(() => reject(new Error('No approval within 120 seconds; run tollgate login again.'))), LOGIN_TIMEOUT_MS);
    const finish = (then: () => void) => {
      clearTimeout(timer);
      server.close();
      server.closeAllConnections();
      then();
    };
    server.on('error', (e) => finish(() => reject(e)));
    server.listen(0, '127.0.0.1', () => onListening((server.address() as AddressInfo).port));
  });
}

/** The platform's "open this URL" command; failing to run it only means the user opens the URL by hand. */
function openBrowser(url: string): void {
  const [command, args] =
    process.platform === 'darwin' ? ['open', [url]] : process.platform === 'win32' ? ['explorer', [url]] : ['xdg-open', [url]];
  execFile(command, args, () => {});
}

type Credentials = { merchant_id: string; wallet_id: string; secret_key_id: string; secret_key: string };

async function exchangeCode(server: string, code: string): Promise<Credentials> {
  const res = await fetch(new URL('/v1/auth/callback', server), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ code }),
  });
  const body = (await res.json().catch(() => null)) as (Credentials & { error?: { message: string; code: string } }) | null;
  if (!res.ok || !body) throw new ApiCallError(body?.error ? `${body.error.message} (${body.error.code})` : `HTTP ${res.status}`);
  return body;
}

/** `tollgate login`, `whoami`, `logout`: the browser authorization flow, credentials kept in a 0600 file. */
export function sessionCommands(run: (work: () => Promise<unknown>) => Promise<void>): Command[] {
  const login = new Command('login')
    .description('sign in through the browser and keep a new secret key for the other commands')
    .option('--server <url>', 'the Tollgate server (env TOLLGATE_API_URL)', process.env.TOLLGATE_API_URL ?? DEFAULT_API_URL)
    .action((opts: { server: string }) =>
      run(async () => {
        const server = new URL(opts.server).origin;
        const state = randomBytes(16).toString('hex');
        const code = await waitForCode(state, (port) => {
          const url = `${server}/auth/connect?state=${state}&port=${port}`;
          console.error(`Opening ${url}\nIf no browser opens, visit that address and approve.`);
          openBrowser(url);
        });
        const credentials = await exchangeCode(server, code);
        const stored = {
          server,
          merchant_id: credentials.merchant_id,
          wallet_id: credentials.wallet_id,
          secret_key_id: credentials.secret_key_id,
          secret_key: credentials.secret_key,
        };
        writeCredentials(stored);
        return { logged_in: true, server, merchant_id: stored.merchant_id, secret_key_id: stored.secret_key_id, credentials_file: credentialsPath() };
      }),
    );

  const whoami = new Command('whoami').description('show the stored login and check that its key still works').action(() =>
    run(async () => {
      const stored = readCredentials();
      if (!stored) throw new ApiCallError('Not logged in: run tollgate login.');
      await callApi({ apiUrl: stored.server, secretKey: stored.secret_key }, 'GET', 'secret_keys?limit=1');
      return { server: stored.server, merchant_id: stored.merchant_id, wallet_id: stored.wallet_id, secret_key_id: stored.secret_key_id };
    }),
  );

  const logout = new Command('logout').description('revoke the stored key on the server and delete it locally').action(() =>
    run(async () => {
      const stored = readCredentials();
      if (!stored) return { logged_out: false, reason: 'not logged in' };
      let revoked = true;
      try {
        await callApi({ apiUrl: stored.server, secretKey: stored.secret_key }, 'DELETE', `secret_keys/${encodeURIComponent(stored.secret_key_id)}`);
      } catch (e) {
        if (!(e instanceof ApiCallError)) throw e;
        // Already revoked, the last key, or the server unreachable: forgetting it locally still logs out.
        revoked = false;
      }
      removeCredentials();
      return { logged_out: true, key_revoked: revoked };
    }),
  );

  return [login, whoami, logout];
}
