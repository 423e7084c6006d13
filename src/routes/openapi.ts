import type { App } from '../http/types.ts';

/** The OpenAPI document, generated from the same zod schemas the routes validate with. */
export function registerOpenApiRoute(app: App): void {
  app.get('/v1/openapi.json', { config: { public: true }, schema: { hide: true } }, async () => app.swagger());
}
