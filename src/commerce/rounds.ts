/**
 * Runs `round` every `intervalMs` until stopped: a round still running when the next is due is
 * not started twice (the next interval tries again), and a failed round goes to `onError` without
 * ending the loop. `stop` clears the timer, tells a running round through `stopping` so it can end
 * early, and waits for it. The timer does not keep the process alive.
 */
export function runEveryInterval(
  intervalMs: number,
  round: (stopping: () => boolean) => Promise<unknown>,
  onError: (err: unknown) => void,
): { stop(): Promise<void> } {
  let running: Promise<unknown> | null = null;
  let stopped = false;
  const stopping = () => stopped;
  const timer = setInterval(() => {
    if (running) return;
    running = round(stopping)
      .catch(onError)
      .finally(() => {
        running = null;
      });
  }, intervalMs);
  timer.unref();
  return {
    stop: async () => {
      stopped = true;
      clearInterval(timer);
      await running;
    },
  };
}
