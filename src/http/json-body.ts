import type { FastifyInstance } from 'fastify';
import { ApiError } from './errors.ts';
import { assertJsonDepth } from './json-depth.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The body exactly as received, for idempotency fingerprints. */
    rawBody?: string;
  }
}

/**
 * JSON bodies, with one deliberate leniency: a JSON content type with an empty body is a request
 * without a body. Published clients send `Content-Type: application/json` on every call.
 */
export function installJsonBodyParser(app: FastifyInstance, bodyLimit: number): void {
  app.removeContentTypeParser('application/json');
  // Fastify's built-in text/plain parser would hand the schema a string (a 400 that hides the real
  // problem); every body here is JSON, so anything else is 415 unsupported_media_type.
  app.removeContentTypeParser('text/plain');
  // Fastify tests the pattern against the normalised header (lower-case media type, then
  // `; name="value"` parameters), so the media type must end at `;` as well as at the end.
  app.addContentTypeParser(
    /^application\/([\w.+-]*\+)?json(;|$)/,
    { parseAs: 'string', bodyLimit },
    (request, body, done) => {
      const text = String(body);
      request.rawBody = text;
      if (text.trim() === '') return done(null, undefined);
      try {
        assertJsonDepth(text);
      } catch (e) {
        return done(e as ApiError, undefined);
      }
      try {
        done(null, JSON.parse(text));
      } catch (e) {
        done(new ApiError('invalid_json', `The request body is not valid JSON: ${(e as Error).message}`), undefined);
      }
    },
  );
}
