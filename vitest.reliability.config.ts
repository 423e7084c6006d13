import { defineConfig } from 'vitest/config';

/**
 * The reliability suite (`npm run test:reliability`, issue 22): database faults, idempotency race,
 * fuzzing of every documented operation, and the security sweep. Loopback only; one file at a
 * time, so each part has the machine to itself and the whole suite stays within a few minutes.
 */
export default defineConfig({
  test: {
    include: ['test/reliability/**/*.reliability.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 300_000,
    hookTimeout: 60_000,
    pool: 'forks',
    fileParallelism: false,
    reporters: ['default'],
  },
});
