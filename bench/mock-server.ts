/** The test suite's mock provider, as its own process, so the load generator does not share its event loop. */
import { startMockUpstream } from '../test/helpers/mock-upstream.ts';

const mock = await startMockUpstream();
// Recorded requests are for tests; a benchmark would only grow memory with them.
setInterval(() => mock.requests.splice(0), 1000).unref();
process.stdout.write(`${mock.url}\n`);
process.on('SIGTERM', () => void mock.close().then(() => process.exit(0)));
