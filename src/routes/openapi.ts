import type { App } from '../http/types.ts';

/**
 * The OpenAPI document, generated from the same zod schemas the routes validate with.
 * The gateway's routes pass provider bodies through untouched, so they have no body schema to
 * generate from; they are described here instead, so the document still lists every endpoint.
 */
export function registerOpenApiRoute(app: App): void {
  let document: Record<string, unknown> | null = null;
  app.get('/v1/openapi.json', { config: { public: true }, schema: { hide: true } }, async () => {
    document ??= withGatewayPaths(app.swagger() as unknown as Record<string, unknown>);
    return document;
  });
}

type Operation = Record<string, unknown>;

const tollgateError = {
  type: 'object',
  required: ['error'],
  properties: {
    error: {
      type: 'object',
      required: ['message', 'code', 'status'],
      properties: {
        message: { type: 'string' },
        code: { type: 'string' },
        status: { type: 'integer' },
        issues: {
          type: 'array',
          items: { type: 'object', properties: { path: { type: 'array', items: {} }, message: { type: 'string' } } },
        },
      },
    },
  },
};

/** OpenAI's error shape (OpenAI-compatible providers answer it too); `code` may be a string, a number or null. */
const openaiError = {
  type: 'object',
  required: ['error'],
  properties: { error: { type: 'object', required: ['message'], properties: { message: { type: 'string' }, type: { type: ['string', 'null'] }, param: {}, code: {} } } },
};

const anthropicError = {
  type: 'object',
  required: ['type', 'error'],
  properties: { type: { const: 'error' }, error: { type: 'object', required: ['type', 'message'], properties: { type: { type: 'string' }, message: { type: 'string' } } } },
};

/** Google's RPC error: `code` is the HTTP status, `status` the RPC status name. */
const googleError = {
  type: 'object',
  required: ['error'],
  properties: { error: { type: 'object', required: ['code', 'message'], properties: { code: { type: 'integer' }, message: { type: 'string' }, status: { type: 'string' }, details: { type: 'array' } } } },
};

/**
 * A gateway error: Tollgate's refusals come in the error dialect of the client's provider surface
 * (decision 0021), and an error the provider answered is relayed in its own shape (forward) or the
 * client's format (rewrite), so the body is one of the four dialects.
 */
const errorResponse = (description: string) => ({
  description: `${description} In the dialect of the provider surface (Tollgate's envelope, or OpenAI's, Anthropic's or Google's error shape, keeping the interface's \`code\`); an error the provider answered is relayed in its own shape, or in the client's format through the rewrite proxy.`,
  content: { 'application/json': { schema: { anyOf: [tollgateError, openaiError, anthropicError, googleError] } } },
});

const passThroughBody = (description: string) => ({
  required: false,
  description,
  content: { '*/*': { schema: {} } },
});

const gatewayResponses = {
  '200': { description: "The provider's response, relayed byte for byte (JSON or an event stream)." },
  '400': errorResponse('Bad request: missing or invalid `u`, forward token not valid base64 JSON, or a host that is not a provider (`unsupported_provider`).'),
  '401': errorResponse('Missing, unknown, revoked or expired key.'),
  '402': errorResponse('The paying wallet (or the spend key\'s spend limit) cannot cover the request\'s hold.'),
  '403': errorResponse('A spend key that is paused, or not allowed this provider, model or request shape.'),
  '429': errorResponse('A spend key\'s rate or request limit.'),
  '504': errorResponse('The provider did not answer in time.'),
};

const credentialNote =
  'Credentials: a secret key, spend key or base64 JSON forward token in `Authorization: Bearer`, `x-api-key`, ' +
  '`x-goog-api-key`, `xi-api-key` or the `key` query parameter. Every response carries the id of its request record in `x-tollgate-request-id` and `x-lava-request-id`.';

const forwardOperation = (method: string): Operation => ({
  tags: ['gateway'],
  summary: `Forward a ${method} request to an AI provider`,
  description:
    'Forwards to the provider URL in `u` (a registered or operator-declared provider only), meters the usage and bills it. ' +
    credentialNote,
  parameters: [
    { name: 'u', in: 'query', required: true, description: 'The provider URL, percent-encoded or raw.', schema: { type: 'string' } },
    { name: 'metadata', in: 'query', required: false, description: 'JSON object of metadata recorded on the request.', schema: { type: 'string' } },
    { name: 'x-lava-metadata', in: 'header', required: false, description: 'Metadata as a JSON object (alternative to the query parameter); never sent to the provider.', schema: { type: 'string' } },
    { name: 'x-service-metadata', in: 'header', required: false, description: 'Same as x-lava-metadata (which wins on a shared key).', schema: { type: 'string' } },
    {
      name: 'x-lava-metadata-{key}',
      in: 'header',
      required: false,
      description: 'One metadata pair per header, e.g. `X-Lava-Metadata-User-Id: 42` records `user_id: "42"` (the name lower-cased, hyphens as underscores); wins over the JSON headers, loses to the query parameter. Never sent to the provider.',
      schema: { type: 'string' },
    },
  ],
  ...(method === 'GET' || method === 'DELETE' ? {} : { requestBody: passThroughBody('The provider request body, passed through unchanged.') }),
  responses: gatewayResponses,
});

const dropInOperation = (summary: string, shape: 'OpenAI' | 'Anthropic' | 'Gemini', hasBody = true): Operation => ({
  tags: ['drop-in'],
  summary,
  description: `${shape}-shaped drop-in endpoint: point the ${shape} SDK's base URL at Tollgate and use a secret key or spend key as its API key. ${shape === 'Gemini' ? "Forwarded to Google's native API for the model in the path." : 'Routed by `model` (or `provider/model`).'} ${credentialNote}`,
  ...(hasBody ? { requestBody: passThroughBody(`The ${shape} request body, passed through unchanged.`) } : {}),
  responses: gatewayResponses,
});

const rewriteOperation: Operation = {
  tags: ['gateway'],
  summary: 'Call a provider in another chat format (rewrite proxy)',
  description:
    "The request body in the client's format (`openai` Chat Completions, or the Responses API when the URL ends in `/responses`; " +
    '`anthropic` Messages; `google` generateContent) is translated ' +
    "to the provider's, and the answer (JSON, error or event stream) back; admission, metering and billing are /v1/forward's. " +
    'Fields that cannot be translated are refused with `untranslatable_request`, naming each; `bedrock` is `unsupported_format`. ' +
    'Rules: docs/decisions/0022-rewrite-proxy.md and 0028-rewrite-endpoints-and-responses.md. ' +
    credentialNote,
  parameters: [
    { name: 'format', in: 'path', required: true, description: "The client's format.", schema: { type: 'string', enum: ['openai', 'anthropic', 'google'] } },
    {
      name: 'providerUrl',
      in: 'path',
      required: true,
      description:
        "The provider's chat endpoint or base URL (with or without its version), raw (`https://api.openai.com/v1/chat/completions`) or without scheme, " +
        "followed by the path the client's SDK appends; may contain slashes.",
      schema: { type: 'string' },
    },
    { name: 'metadata', in: 'query', required: false, description: 'JSON object of metadata recorded on the request.', schema: { type: 'string' } },
  ],
  requestBody: { required: true, description: "The request in the client's format.", content: { 'application/json': { schema: { type: 'object' } } } },
  responses: {
    ...gatewayResponses,
    '200': { description: "The provider's answer in the client's format (JSON, or an event stream when the request streams)." },
    '400': errorResponse('`unsupported_format`, `untranslatable_request` (with `issues` naming each field), `unsupported_provider`, `invalid_json`.'),
  },
};

const modelParameter = (example: string) => ({ name: 'model', in: 'path', required: true, description: `The model, e.g. ${example}`, schema: { type: 'string' } });

/** Gemini's native API as @google/genai calls it (`apiVersion` v1 or v1beta), the key in `x-goog-api-key` or `?key=`. */
function geminiPaths(): Record<string, Record<string, Operation>> {
  const paths: Record<string, Record<string, Operation>> = {};
  for (const version of ['v1', 'v1beta']) {
    for (const method of ['generateContent', 'streamGenerateContent', 'countTokens', 'embedContent', 'batchEmbedContents']) {
      const operation = dropInOperation(`Gemini ${method} (${version})`, 'Gemini');
      paths[`/${version}/models/{model}:${method}`] = {
        post: {
          ...operation,
          parameters: [
            modelParameter('`gemini-2.5-flash`.'),
            ...(method === 'streamGenerateContent'
              ? [{ name: 'alt', in: 'query', required: false, description: '`sse` for an event stream (else a JSON array).', schema: { type: 'string' } }]
              : []),
          ],
        },
      };
    }
  }
  return paths;
}

const GATEWAY_PATHS: Record<string, Record<string, Operation>> = {
  '/v1/forward': Object.fromEntries(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'].map((m) => [m.toLowerCase(), forwardOperation(m)])),
  '/v1/chat/completions': { post: dropInOperation('Chat completions', 'OpenAI') },
  '/v1/responses': { post: dropInOperation('Responses', 'OpenAI') },
  '/v1/embeddings': { post: dropInOperation('Embeddings', 'OpenAI') },
  '/v1/models': { get: dropInOperation('Models this key may use (Anthropic\'s shape for an Anthropic client, Gemini\'s for a Gemini client)', 'OpenAI', false) },
  '/v1/models/{model}': { get: { ...dropInOperation('One model this key may use (404 otherwise)', 'OpenAI', false), parameters: [modelParameter('`gpt-4o`, `anthropic/claude-sonnet-4-5`; an Anthropic client names it bare.')] } },
  '/v1beta/models': { get: dropInOperation('Gemini models this key may use', 'Gemini', false) },
  '/v1beta/models/{model}': { get: { ...dropInOperation('One Gemini model this key may use (404 otherwise)', 'Gemini', false), parameters: [modelParameter('`gemini-2.5-flash`.')] } },
  '/v1/messages': { post: dropInOperation('Messages', 'Anthropic') },
  '/v1/messages/count_tokens': { post: dropInOperation("Count a message's tokens (forwarded to Anthropic, recorded at no cost)", 'Anthropic') },
  ...geminiPaths(),
  '/v1/rewrite/{format}/{providerUrl}': { post: rewriteOperation },
};

function withGatewayPaths(generated: Record<string, unknown>): Record<string, unknown> {
  const paths = { ...(generated.paths as Record<string, unknown> | undefined), ...GATEWAY_PATHS };
  return { ...generated, paths };
}
