import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { FastifyInstance } from 'fastify';
import { DASHBOARD_JS } from './dashboard-script.ts';
import { FORMS_JS } from './forms-script.ts';
import { TOLLGATE_CSS } from './styles.ts';

type Asset = { type: string; body: string | Buffer };

const require = createRequire(import.meta.url);

/** A file of an installed package, read once on first request (the chart library). */
function packageFile(specifier: string, type: string): () => Asset {
  let cached: Asset | undefined;
  return () => (cached ??= { type, body: readFileSync(require.resolve(specifier)) });
}

const ASSETS: Record<string, () => Asset> = {
  'tollgate.css': () => ({ type: 'text/css; charset=utf-8', body: TOLLGATE_CSS }),
  'dashboard.js': () => ({ type: 'text/javascript; charset=utf-8', body: DASHBOARD_JS }),
  'forms.js': () => ({ type: 'text/javascript; charset=utf-8', body: FORMS_JS }),
  'uplot.js': packageFile('uplot/dist/uPlot.iife.min.js', 'text/javascript; charset=utf-8'),
  'uplot.css': packageFile('uplot/dist/uPlot.min.css', 'text/css; charset=utf-8'),
};

/** Every asset a page loads comes from here: pages make no request to another origin. */
export function registerAssetRoutes(app: FastifyInstance): void {
  app.get<{ Params: { name: string } }>('/assets/:name', { schema: { hide: true } }, async (request, reply) => {
    const asset = ASSETS[request.params.name]?.();
    if (!asset) return reply.status(404).type('text/plain; charset=utf-8').send('Not found');
    return reply
      .type(asset.type)
      .header('cache-control', 'public, max-age=3600')
      .header('x-content-type-options', 'nosniff')
      .send(asset.body);
  });
}
