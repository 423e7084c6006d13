import { setImmediate as nextTurn } from 'node:timers/promises';
import { Dispatcher } from 'undici';
import type { Clock } from '../domain/clock.ts';
import type { LocalAnswer, LocalRequest, ProviderModule } from '../providers/types.ts';

type Answerer = (request: LocalRequest) => LocalAnswer;

/**
 * The upstream of a provider that answers in process (the demo): an undici dispatcher, so the
 * relay drives it exactly as it drives a network call — the same callbacks, back-pressure, client
 * aborts and metering — while the answer comes from the provider module and no socket is opened.
 */
export class LocalUpstream extends Dispatcher {
  readonly #answer: Answerer;
  readonly #clock: Clock;

  constructor(answer: Answerer, clock: Clock) {
    super();
    this.#answer = answer;
    this.#clock = clock;
  }

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    void this.#exchange(options, handler);
    return true;
  }

  override close(): Promise<void>;
  override close(callback: () => void): void;
  override close(callback?: () => void): Promise<void> | void {
    if (callback) callback();
    else return Promise.resolve();
  }

  override destroy(): Promise<void>;
  override destroy(err: Error | null): Promise<void>;
  override destroy(callback: () => void): void;
  override destroy(err: Error | null, callback: () => void): void;
  override destroy(first?: Error | null | (() => void), second?: () => void): Promise<void> | void {
    const callback = typeof first === 'function' ? first : second;
    if (callback) callback();
    else return Promise.resolve();
  }

  async #exchange(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): Promise<void> {
    const controller = new LocalController();
    // Answered on a later turn, as a network answer would be: the relay has set itself up by then.
    await nextTurn();
    handler.onRequestStart?.(controller, {});
    let answer: LocalAnswer;
    try {
      answer = this.#answer(localRequestOf(options, this.#clock.now()));
    } catch (e) {
      handler.onResponseError?.(controller, e as Error);
      return;
    }
    if (controller.aborted) return handler.onResponseError?.(controller, controller.reason!);
    const streamed = answer.chunks.length > 1;
    const headers = { ...answer.headers, ...(streamed ? {} : { 'content-length': String(Buffer.byteLength(answer.chunks[0] ?? '')) }) };
    handler.onResponseStart?.(controller, answer.status, headers, '');
    for (const chunk of answer.chunks) {
      // A stream's events go out on separate turns, so the client sees them arrive one by one.
      if (streamed) await nextTurn();
      await controller.whileRunning();
      if (controller.aborted) return handler.onResponseError?.(controller, controller.reason!);
      handler.onResponseData?.(controller, Buffer.from(chunk));
    }
    handler.onResponseEnd?.(controller, {});
  }
}

/** The relay pauses a local answer as it would a socket (a slow client), and aborts it when its client leaves. */
class LocalController implements Dispatcher.DispatchController {
  #aborted = false;
  #paused = false;
  #reason: Error | null = null;
  #wake: (() => void) | null = null;

  get aborted(): boolean {
    return this.#aborted;
  }
  get paused(): boolean {
    return this.#paused;
  }
  get reason(): Error | null {
    return this.#reason;
  }
  abort(reason: Error): void {
    this.#aborted = true;
    this.#reason = reason;
    this.resume();
  }
  pause(): void {
    this.#paused = true;
  }
  resume(): void {
    this.#paused = false;
    this.#wake?.();
    this.#wake = null;
  }
  /** Resolves at once unless paused; then when resumed or aborted. */
  whileRunning(): Promise<void> | void {
    if (!this.#paused) return;
    return new Promise((resolve) => (this.#wake = resolve));
  }
}

function localRequestOf(options: Dispatcher.DispatchOptions, now: number): LocalRequest {
  const url = new URL(options.path, options.origin);
  const body = Buffer.isBuffer(options.body) ? options.body.toString('utf8') : typeof options.body === 'string' ? options.body : '';
  return { method: options.method, url, body: parseJson(body), now };
}

function parseJson(text: string): unknown {
  if (text === '') return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/**
 * The dispatcher that reaches `provider`: a local one when it answers in process (made per request:
 * it holds nothing but the app's clock), else `agent`.
 */
export function upstreamFor(provider: ProviderModule, agent: Dispatcher, clock: Clock): Dispatcher {
  const answer = provider.answerLocally;
  return answer ? new LocalUpstream((request) => answer.call(provider, request), clock) : agent;
}
