import { Writable } from 'node:stream';
import { BUILTIN_PROVIDERS } from '../../src/providers/builtin.ts';
import { startGatewayOnMock, type MockGateway } from '../helpers/gateway.ts';
import type { TestDatabase } from '../helpers/databases.ts';

/**
 * Shared parts of the reliability suite (`npm run test:reliability`): apps whose every log line
 * is kept (the security part checks the whole suite's logs for secrets), every provider host
 * mapped to the local mock upstream (no input, however random, reaches a real provider), and the
 * figures each part prints.
 */

/** Every log line every app of this file wrote. */
const logChunks: string[] = [];

export function suiteLogText(): string {
  return logChunks.join('');
}

function logStream(): Writable {
  return new Writable({
    write(chunk, _encoding, done) {
      logChunks.push(String(chunk));
      done();
    },
  });
}

/** Every host a built-in provider module serves: all of them lead to the mock. */
export const ALL_PROVIDER_HOSTS = [...new Set(BUILTIN_PROVIDERS.flatMap((p) => p.hosts))];

/** A listening app on a mock upstream, logging at info into the suite's log, with a high rate limit. */
export async function startSuiteGateway(dialect: TestDatabase['dialect'], env: Record<string, string> = {}): Promise<MockGateway> {
  return startGatewayOnMock(dialect, {
    providerHosts: ALL_PROVIDER_HOSTS,
    providerKeys: { openai: 'sk-managed-openai-suite', anthropic: 'sk-ant-managed-suite' },
    env: { LOG_LEVEL: 'info', RATE_LIMIT_PER_MINUTE: '100000000', ...env },
    logStream: logStream(),
  });
}

/** Prints one part's figures on one line, so CI output shows what was proven. */
export function printFigures(part: string, figures: Record<string, number | string>): void {
  const text = Object.entries(figures)
    .map(([name, value]) => `${name}=${value}`)
    .join(' ');
  process.stdout.write(`[reliability] ${part}: ${text}\n`);
}
