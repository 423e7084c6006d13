import type { IncomingMessage, ServerResponse } from 'node:http';
import type { FastifyBaseLogger, FastifyInstance, RawServerDefault } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import type { Clock } from '../domain/clock.ts';

export type App = FastifyInstance<RawServerDefault, IncomingMessage, ServerResponse, FastifyBaseLogger, ZodTypeProvider>;

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Routes that need no merchant secret key (health, OpenAPI, CLI code exchange). */
    public?: boolean;
  }
}

/** The app's current time in milliseconds (its injected clock's). */
export function nowOf(deps: { clock: Clock }): number {
  return deps.clock.now();
}

/** The same, as an ISO 8601 timestamp (what rows store). */
export function nowIsoOf(deps: { clock: Clock }): string {
  return new Date(deps.clock.now()).toISOString();
}
