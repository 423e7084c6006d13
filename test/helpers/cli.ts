import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Runs the `tollgate` CLI as a user would, returning its exit code and output instead of throwing. */
export async function tollgate(args: string[], env: Record<string, string> = {}) {
  try {
    const { stdout, stderr } = await run('node', ['bin/tollgate.js', ...args], {
      env: { ...process.env, LOG_LEVEL: 'silent', ...env },
      timeout: 30_000,
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}
