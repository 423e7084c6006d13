import { z } from 'zod';
import { principalOf } from '../http/auth.ts';
import { LAVA_METADATA_HEADER, mergeMetadata, METADATA_HEADER, outsideMetadata, type MetadataHeaders } from '../http/metadata.ts';
import { pageResponse } from '../http/pagination.ts';
import { errorResponse, idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import type { UnwrittenHolds } from '../ledger/wallets.ts';
import type { PendingRecords } from '../gateway/pending-records.ts';
import {
  findRequestRecord,
  listRequestRecords,
  listRequestsQuery,
  recordRequestBody,
  requestRecorder,
  requestRecordSchema,
  type RecordRequestBody,
} from '../services/requests.ts';

const createQuery = z.object({
  metadata: z
    .string()
    .optional()
    .describe(`JSON object of metadata, merged with the body's (the body wins on a shared key; this wins over the ${METADATA_HEADER}, ${LAVA_METADATA_HEADER} and ${LAVA_METADATA_HEADER}-<key> headers)`),
});

/**
 * The request's metadata from all three places it may arrive, merged key by key: the body's own
 * wins over the query parameter and the header (see outsideMetadata). Without any from the query
 * or header the body stays as sent, so its replay hash is unchanged.
 */
function withOutsideMetadata(body: RecordRequestBody, fromQuery: string | undefined, headers: MetadataHeaders): RecordRequestBody {
  const outside = outsideMetadata(fromQuery, headers);
  if (Object.keys(outside).length === 0) return body;
  return Object.assign({}, body, { metadata: mergeMetadata(outside, body.metadata) });
}

const tags = ['requests'];

/** `unwritten`: the app's holds admitted in process and not written yet, which a charge must leave. */
export function registerRequestRoutes(app: App, deps: AppDeps, unwritten: UnwrittenHolds, pending?: Pick<PendingRecords, 'find'>): void {
  const recorder = requestRecorder(deps, unwritten, app.log);
  app.addHook('onClose', () => recorder.drain());

  app.post(
    '/requests',
    {
      schema: {
        tags,
        body: recordRequestBody,
        querystring: createQuery,
        response: {
          200: requestRecordSchema,
          201: requestRecordSchema,
          ...standardErrors,
          402: errorResponse('`insufficient_balance`: the wallet (after an auto top-up, if it has one) cannot cover the charge; nothing was recorded'),
        },
      },
    },
    async (request, reply) => {
      const body = withOutsideMetadata(request.body, request.query.metadata, request.headers);
      const { status, row } = await recorder.record(principalOf(request), body);
      return reply.status(status).send(row);
    },
  );

  app.get(
    '/requests',
    { schema: { tags, querystring: listRequestsQuery, response: { 200: pageResponse(requestRecordSchema), ...standardErrors } } },
    async (request) => listRequestRecords(deps.storage, principalOf(request).merchantId, request.query),
  );

  app.get(
    '/requests/:id',
    {
      schema: {
        tags,
        description:
          'A forwarded request is found as soon as its answer has started (its id is in the response headers): `status: pending` while it is relayed and settled, with its customer, meter, provider, model, endpoint, metadata and created_at, usage and costs all zero; `completed` (or `error`) once settled, usually within some 50 ms of the answer ending.',
        params: idParams,
        response: { 200: requestRecordSchema, ...standardErrors },
      },
    },
    async (request) => {
      const { merchantId } = principalOf(request);
      // Looked at before the database: an entry goes only once its record is written.
      return findRequestRecord(deps.storage, merchantId, request.params.id, pending?.find(merchantId, request.params.id));
    },
  );
}
