import { applyKey } from './auth.ts';
import { arrayAt, countAt, streamFlagSet, stringAt } from './json.ts';
import { routeFromBaseUrl } from './route.ts';
import { emptyUsage, withIdentity } from './usage.ts';
import type { MeterContext, ProviderModule, StreamMeter, UsageReport } from './types.ts';

/**
 * ElevenLabs voice API. Billing units differ by endpoint:
 * - text-to-speech and text-to-dialogue: characters of the input text, known from the request,
 *   whatever comes back (audio bytes, a JSON with timestamps, or an audio stream);
 * - speech-to-text: seconds of audio. The request is a multipart upload we do not decode, and the
 *   transcript documents no duration field, so we take an explicit duration if one is present and
 *   otherwise the end time of the last transcribed word (which leaves out trailing silence).
 * Other endpoints (voices, models, history) carry no usage.
 */
export const elevenlabs: ProviderModule = {
  id: 'elevenlabs',
  displayName: 'ElevenLabs',
  family: 'elevenlabs',
  baseUrl: 'https://api.elevenlabs.io/v1',
  ...routeFromBaseUrl('https://api.elevenlabs.io/v1', ['/v1', '/v2']),
  authStyle: 'xi-api-key',
  custom: false,
  applyAuth: (headers, key) => applyKey(headers, 'xi-api-key', key),
  usageFromJson,
  usageFromRequest,
  createStreamMeter,
  modelFrom: (requestBody) => stringAt(requestBody, 'model_id') ?? null,
  responseId: (body) => stringAt(body, 'transcription_id') ?? null,
  prepareStreamRequest: (body) => ({ body, injectedUsage: false }),
  isInjectedUsageEvent: () => false,
  requestsStream: streamFlagSet,
};

type Endpoint = 'text-to-speech' | 'text-to-dialogue' | 'speech-to-text' | 'other';

/** `/v1/text-to-speech/<voice>[/stream][/with-timestamps]`, `/v1/text-to-dialogue[…]`, `/v1/speech-to-text`. */
function elevenLabsEndpoint(pathname: string): Endpoint {
  const [, kind, ...rest] = pathname.split('/').filter(Boolean);
  if (kind === 'text-to-speech' && rest.length > 0) return 'text-to-speech';
  if (kind === 'text-to-dialogue') return 'text-to-dialogue';
  // Exactly the create call: /v1/speech-to-text/transcripts/<id> only reads a stored result.
  if (kind === 'speech-to-text' && rest.length === 0) return 'speech-to-text';
  return 'other';
}

function usageFromRequest(ctx: MeterContext): UsageReport | null {
  const characters = inputCharacters(ctx);
  if (characters === null) return null;
  return withIdentity({ ...emptyUsage(), inputCharacters: characters }, stringAt(ctx.requestBody, 'model_id') ?? null, null);
}

function usageFromJson(body: unknown, ctx: MeterContext): UsageReport | null {
  if (elevenLabsEndpoint(ctx.url.pathname) !== 'speech-to-text') return usageFromRequest(ctx);
  const seconds = transcriptSeconds(body);
  if (seconds === undefined) return null;
  return withIdentity(
    { ...emptyUsage(), inputSeconds: seconds },
    stringAt(ctx.requestBody, 'model_id') ?? null,
    stringAt(body, 'transcription_id') ?? null,
  );
}

/** Characters as Unicode code points, so an emoji counts once, not as two UTF-16 units. */
function inputCharacters(ctx: MeterContext): number | null {
  const endpoint = elevenLabsEndpoint(ctx.url.pathname);
  if (endpoint === 'text-to-speech') {
    const text = stringAt(ctx.requestBody, 'text');
    return text === undefined ? null : [...text].length;
  }
  if (endpoint === 'text-to-dialogue') {
    const inputs = arrayAt(ctx.requestBody, 'inputs') ?? [];
    return inputs.reduce<number>((sum, input) => sum + [...(stringAt(input, 'text') ?? '')].length, 0);
  }
  return null;
}

/** An explicit duration when present, else the latest word end over all channels. */
function transcriptSeconds(body: unknown): number | undefined {
  const explicit = countAt(body, 'audio_duration_secs') ?? countAt(body, 'duration');
  if (explicit !== undefined) return explicit;
  const channels = arrayAt(body, 'transcripts') ?? [body];
  let latestEnd: number | undefined;
  // A loop, not Math.max(...ends): a long transcript has more words than a call has arguments.
  for (const channel of channels) {
    for (const word of arrayAt(channel, 'words') ?? []) {
      const end = countAt(word, 'end');
      if (end !== undefined && (latestEnd === undefined || end > latestEnd)) latestEnd = end;
    }
  }
  return latestEnd;
}

/**
 * ElevenLabs streams audio, not events: the usage is fixed by the request, so the meter ignores
 * the bytes and nothing can be missing when the stream is cut.
 */
function createStreamMeter(ctx: MeterContext): StreamMeter {
  return {
    push: () => undefined,
    finish: () => ({ ...(usageFromRequest(ctx) ?? emptyUsage()), complete: true, estimated: false }),
  };
}
