import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { afterAll, beforeAll, expect } from 'vitest';
import type { App } from '../../src/http/types.ts';

/**
 * Holds every answer a test sees against the OpenAPI document the app serves (/v1/openapi.json,
 * built from the routes' zod schemas): its status must be one the operation lists, its
 * content type one the response declares, and its JSON body must match that response's schema.
 * The document can then not drift from what is served without a test saying where.
 */

type Json = Record<string, unknown>;
type Document = { paths: Record<string, Record<string, Json>> };

export type SeenResponse = { method: string; url: string; status: number; contentType: string | null; body: string };

// ajv-formats is CommonJS: its function is the default export's default under ESM interop.
const addFormats = ((addFormatsModule as unknown as { default?: typeof addFormatsModule }).default ?? addFormatsModule) as unknown as (ajv: Ajv2020) => Ajv2020;

const HTTP_METHODS = new Set(['get', 'put', 'post', 'delete', 'patch', 'head', 'options']);

export class OpenApiResponses {
  readonly #document: Document;
  readonly #ajv: Ajv2020;
  /** Each documented path as a pattern, literal paths before templated ones so /v1/x/new beats /v1/x/{id}. */
  readonly #patterns: { template: string; pattern: RegExp; literal: number }[];
  readonly problems: string[] = [];
  /** How many answers were held against the document, so a test can tell the check ran. */
  checked = 0;

  constructor(document: Json) {
    this.#document = document as unknown as Document;
    // The served document is OpenAPI 3.1, whose schemas are JSON Schema 2020-12; OpenAPI's own
    // keywords (example, discriminator…) are not validation keywords, so unknown keywords are allowed.
    this.#ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: true });
    addFormats(this.#ajv);
    this.#ajv.addSchema(document, 'openapi');
    this.#patterns = Object.keys(this.#document.paths)
      .map((template) => ({ template, pattern: templatePattern(template), literal: template.replace(/\{[^}]+\}/g, '').length }))
      .sort((a, b) => b.literal - a.literal);
  }

  /** Holds one answer against the document; returns what is wrong with it (also kept in `problems`). */
  check(seen: SeenResponse): string[] {
    const path = new URL(seen.url, 'http://test.invalid').pathname;
    const found = this.#patterns.find((p) => p.pattern.test(path));
    const where = `${seen.method} ${path} → ${seen.status}`;
    // Pages and assets (the dashboard, checkout) are not part of the API document.
    if (!found) return [];
    this.checked++;
    const problems = this.#problems(found.template, seen, where);
    this.problems.push(...problems);
    return problems;
  }

  #problems(template: string, seen: SeenResponse, where: string): string[] {
    const method = seen.method.toLowerCase();
    const operation = this.#document.paths[template]?.[method] as { responses?: Record<string, Json> } | undefined;
    if (!operation || !HTTP_METHODS.has(method)) return [`${where}: ${seen.method} ${template} is not in the document`];
    const responses = operation.responses ?? {};
    const statusKey = [String(seen.status), `${String(seen.status)[0]}XX`, 'default'].find((key) => key in responses);
    if (!statusKey) return [`${where}: status ${seen.status} is not among the documented ${Object.keys(responses).join(', ')} of ${seen.method} ${template}`];
    const content = responses[statusKey]!.content as Record<string, { schema?: unknown }> | undefined;
    // A response documented without content (a relayed provider answer) says nothing of its body.
    if (!content) return [];
    const mediaType = (seen.contentType ?? '').split(';')[0]!.trim().toLowerCase();
    const declared = Object.keys(content);
    const media = declared.find((type) => type === mediaType) ?? declared.find((type) => type === '*/*' || (type.endsWith('/*') && mediaType.startsWith(type.slice(0, -1))));
    if (!media) return [`${where}: content type ${mediaType || '(none)'} is not among the documented ${declared.join(', ')}`];
    if (!content[media]!.schema || !/json/.test(media)) return [];
    let body: unknown;
    try {
      body = JSON.parse(seen.body);
    } catch {
      return [`${where}: the body is not JSON: ${seen.body.slice(0, 200)}`];
    }
    const pointer = ['paths', template, method, 'responses', statusKey, 'content', media, 'schema'].map(pointerSegment).join('/');
    const validate = this.#ajv.getSchema(`openapi#/${pointer}`);
    if (!validate) return [`${where}: the schema at ${pointer} does not compile`];
    if (validate(body)) return [];
    return (validate.errors ?? []).map((e) => `${where}: ${e.instancePath || '(body)'} ${e.message}${e.params ? ` ${JSON.stringify(e.params)}` : ''}`);
  }
}

/** `/v1/customers/{customer_id}` → a pattern; a parameter is one segment, except a path's last one (`{providerUrl}`) may hold slashes. */
function templatePattern(template: string): RegExp {
  const parts = template.split(/(\{[^}]+\})/);
  const source = parts
    .map((part, i) => {
      if (!/^\{[^}]+\}$/.test(part)) return part.replace(/[.*+?^$()|[\]\\]/g, '\\$&');
      return i === parts.length - 2 && parts.at(-1) === '' ? '.+' : '[^/]+';
    })
    .join('');
  return new RegExp(`^${source}/?$`);
}

/** A JSON pointer segment inside a URI fragment: ~ and / escaped, then percent-encoded. */
function pointerSegment(segment: string): string {
  return encodeURIComponent(segment.replace(/~/g, '~0').replace(/\//g, '~1'));
}

/** The document `app` serves at /v1/openapi.json. */
export async function servedDocument(app: App): Promise<Json> {
  const res = await app.inject({ method: 'GET', url: '/v1/openapi.json' });
  if (res.statusCode !== 200) throw new Error(`GET /v1/openapi.json answered ${res.statusCode}`);
  return res.json();
}

/**
 * For a describe block whose app listens on loopback: while the block runs, the process's fetch
 * is wrapped so that every answer from the app's base URL is held against the document, whatever
 * client made the call (the published Lava client, an OpenAI SDK, a bare fetch); the block's
 * afterAll fails naming every mismatch (and if no answer was checked at all). `target` gives the
 * started app (a TestApp, say), listening on loopback.
 */
export function checkResponsesAgainstOpenApi(target: () => { app: App }): void {
  const original = globalThis.fetch;
  let checker: OpenApiResponses | undefined;
  const wrapped: typeof fetch = async (input, init) => {
    const res = await original(input, init);
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
    const { app } = target();
    const address = app.server.address();
    if (!address || typeof address === 'string' || !url.startsWith(`http://127.0.0.1:${address.port}/`)) return res;
    checker ??= new OpenApiResponses(await servedDocument(app));
    const method = init?.method ?? (input instanceof Request ? input.method : 'GET');
    const contentType = res.headers.get('content-type');
    // A stream is read by its caller as it arrives: its status and type are checked, not its events.
    const body = contentType?.startsWith('text/event-stream') ? '' : await res.clone().text();
    checker.check({ method, url, status: res.status, contentType, body });
    return res;
  };
  beforeAll(() => {
    globalThis.fetch = wrapped;
  });
  afterAll(() => {
    globalThis.fetch = original;
    expect(checker?.checked ?? 0, 'answers held against the OpenAPI document').toBeGreaterThan(0);
    expect(checker?.problems ?? []).toEqual([]);
  });
}
