import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // client-matrix renders docs/clients.md from the client e2e tests and fails a full run it differs from.
    reporters: ['default', './test/reporters/client-matrix.ts'],
  },
});
