/** The test suite's mock provider, as its own process, so the load generator does not share its event loop. */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { startMockUpstream } from '../test/helpers/mock-upstream.ts';

const mock = await startMockUpstream();
// Recorded requests are for tests; a benchmark would only grow memory with them.
setInterval(() => mock.requests.splice(0), 1000).unref();
// The mock's own event-loop delay, sampled as the server's is (prom-client's 10 ms), so a gateway
// row can set the server's beside a plain Node HTTP server's under the same load on the same host.
// Asked for over IPC ('loop-delay'); each answer resets the histogram.
const loop = monitorEventLoopDelay({ resolution: 10 });
loop.enable();
process.on('message', (message) => {
  if (message !== 'loop-delay') return;
  process.send?.({ p50: loop.percentile(50) / 1e6, p99: loop.percentile(99) / 1e6, max: loop.max / 1e6 });
  loop.reset();
});
process.stdout.write(`${mock.url}\n`);
process.on('SIGTERM', () => void mock.close().then(() => process.exit(0)));
