import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Runs the `tollgate` CLI as a user would, returning its exit code and output instead of throwing. */
export async function tollgate(args: string[], env: Record<string, string> = {}) {
  try {
    const { stdout, stderr } = await run('node', ['bin/tollgate.js', ...args], {
      // A config directory that does not exist: the developer's own `tollgate login` never leaks in.
      env: { ...process.env, LOG_LEVEL: 'silent', XDG_CONFIG_HOME: join(tmpdir(), 'tollgate-test-no-config'), ...env },
      timeout: 30_000,
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}
