import { defineConfig } from 'vitest/config';

/**
 * Reliability guarantees whose proofs sit beside the code they test (and so run in `npm test` too):
 * the suite repeats them so that it states every guarantee on its own — provider-side context in
 * holds, refusals a client can act on, the crash journal's replay, and the smaller input holes
 * (sign-in destinations, webhook URLs, Stripe signatures, CSV cells, a renewal that throws).
 */
const RELIABILITY_TESTS_ELSEWHERE = [
  'test/gateway/provider-context-holds.test.ts',
  'test/gateway/unretryable-refusals.test.ts',
  'test/gateway/call-journal.test.ts',
  'test/integration/call-journal-replay.test.ts',
  'test/web/sign-in-next.test.ts',
  'test/unit/webhook-url-safety.test.ts',
  'test/commerce/stripe.test.ts',
  'test/web/requests-csv.test.ts',
  'test/commerce/renewals.test.ts',
];

/**
 * The reliability suite (`npm run test:reliability`): database faults, idempotency race,
 * fuzzing of every documented operation, the security sweep, crashes under load,
 * money bounds, frozen Redis and oversized bodies. Loopback only; one file at a
 * time, so each part has the machine to itself and the whole suite stays within a few minutes.
 */
export default defineConfig({
  test: {
    include: ['test/reliability/**/*.reliability.ts', ...RELIABILITY_TESTS_ELSEWHERE],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 300_000,
    hookTimeout: 60_000,
    pool: 'forks',
    fileParallelism: false,
    reporters: ['default'],
  },
});
