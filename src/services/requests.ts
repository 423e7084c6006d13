/**
 * Usage records (the requests Tollgate charged): how the API, the dashboard and its CSV export
 * show one, and the filters GET /requests and GET /usage share. Recording one is the charge path
 * of POST /v1/requests (through the ledger).
 */
import { z } from 'zod';
import { formatMoney } from '../domain/money.ts';
import { formatMicros, secondsToMicros } from '../domain/pricing.ts';
import { validationError } from '../http/errors.ts';
import { metadataFiltersSchema, parseJsonParam } from '../http/metadata.ts';
import { customerRef } from '../http/schemas.ts';
import type { Storage } from '../storage/db.ts';
import { resolveCustomerId } from '../storage/connections.ts';
import type { RequestFilters } from '../storage/request-queries.ts';
import type { RequestRow } from '../storage/requests.ts';

const breakdownItem = z.object({
  tier: z.object({ start: z.number(), rate: z.string(), type: z.string() }),
  tokens: z.number(),
  characters: z.number(),
  seconds: z.number(),
  cost: z.string(),
});

/** One record shape serves both vocabularies (a superset of the two variants). */
export const requestRecordSchema = z.object({
  request_id: z.string(),
  status: z.enum(['pending', 'completed', 'error']),
  provider: z.string(),
  endpoint: z.string(),
  provider_key_type: z.enum(['managed', 'unmanaged']),
  model: z.string().nullable().describe('The model the provider served, as its answer names it'),
  requested_model: z.string().nullable().describe('The model the request named, when the provider answered under another name (e.g. gpt-4o-mini served as gpt-4o-mini-2024-07-18); else null'),
  response_id: z.string().nullable(),
  connection_id: z.string().nullable(),
  customer_id: z.string().nullable(),
  product_id: z.string().nullable(),
  meter_id: z.string().nullable(),
  model_usage: z.object({
    input_tokens: z.number(),
    output_tokens: z.number(),
    total_tokens: z.number(),
    cached_input_tokens: z.number().describe('Part of input_tokens read from the provider prompt cache'),
    cache_write_input_tokens: z.number().describe('Part of input_tokens written to the provider prompt cache'),
    reasoning_tokens: z
      .number()
      .describe('Part of output_tokens the model spent reasoning (thinking), as the provider reports it: OpenAI reasoning_tokens, Gemini thoughtsTokenCount; 0 where it reports none (Anthropic counts thinking inside output_tokens only)'),
    output_images: z.number().describe('Images an image generation made'),
    price_unit: z
      .enum(['tokens', 'minutes', 'images', 'characters'])
      .nullable()
      .describe('The unit input_cost and output_cost were priced by: tokens, minutes of audio, images generated or characters spoken; null when no provider price was known'),
    input_characters: z.number(),
    output_characters: z.number(),
    total_characters: z.number(),
    input_seconds: z.number(),
    output_seconds: z.number(),
    total_seconds: z.number(),
    input_cost: z.string(),
    output_cost: z.string(),
    total_cost: z.string(),
    payer: z.enum(['wallet', 'merchant']),
  }),
  fee: z.object({
    amount: z.string(),
    rate_type: z.enum(['fixed', 'percentage']),
    token_basis: z.enum(['input+output', 'output']),
    breakdown: z.array(breakdownItem),
  }),
  service_charge: z.object({ amount: z.string(), payer: z.enum(['wallet', 'merchant']) }),
  total_request_cost: z.string(),
  total_wallet_cost: z.string(),
  total_merchant_cost: z.string(),
  cost: z.string().describe('Base usage cost (newer vocabulary)'),
  charge: z.object({ amount: z.string(), rate_type: z.enum(['fixed', 'percentage']), breakdown: z.array(breakdownItem) }),
  metadata: z.record(z.string(), z.string()),
  usage_estimated: z.boolean().describe('True when part of the usage was estimated (a stream cut mid-way)'),
  timestamp: z.string().nullable(),
  created_at: z.string(),
});
export type RequestRecord = z.infer<typeof requestRecordSchema>;

export function presentRequest(row: RequestRow): RequestRecord {
  const n = (v: bigint) => Number(v);
  const inputSeconds = secondsToMicros(row.input_seconds);
  const outputSeconds = secondsToMicros(row.output_seconds);
  const breakdown = JSON.parse(row.breakdown) as z.infer<typeof breakdownItem>[];
  const baseTotal = row.input_cost + row.output_cost;
  return {
    request_id: row.request_id,
    status: row.status,
    provider: row.provider,
    endpoint: row.endpoint,
    provider_key_type: row.provider_key_type,
    model: row.model,
    requested_model: row.requested_model,
    response_id: row.response_id,
    connection_id: row.connection_id,
    customer_id: row.connection_id,
    product_id: row.meter_id,
    meter_id: row.meter_id,
    model_usage: {
      input_tokens: n(row.input_tokens),
      output_tokens: n(row.output_tokens),
      total_tokens: n(row.input_tokens + row.output_tokens),
      cached_input_tokens: n(row.cached_input_tokens),
      cache_write_input_tokens: n(row.cache_write_input_tokens),
      reasoning_tokens: n(row.reasoning_tokens),
      output_images: n(row.output_images),
      price_unit: row.price_unit,
      input_characters: n(row.input_characters),
      output_characters: n(row.output_characters),
      total_characters: n(row.input_characters + row.output_characters),
      input_seconds: Number(row.input_seconds),
      output_seconds: Number(row.output_seconds),
      total_seconds: Number(formatMicros(inputSeconds + outputSeconds)),
      input_cost: formatMoney(row.input_cost),
      output_cost: formatMoney(row.output_cost),
      total_cost: formatMoney(baseTotal),
      payer: row.base_cost_payer,
    },
    fee: { amount: formatMoney(row.fee_amount), rate_type: row.rate_type, token_basis: row.token_basis, breakdown },
    service_charge: { amount: formatMoney(row.service_charge_amount), payer: row.service_charge_payer },
    total_request_cost: formatMoney(row.total_request_cost),
    total_wallet_cost: formatMoney(row.total_wallet_cost),
    total_merchant_cost: formatMoney(row.total_merchant_cost),
    cost: formatMoney(baseTotal),
    charge: { amount: formatMoney(row.fee_amount), rate_type: row.rate_type, breakdown },
    metadata: JSON.parse(row.metadata) as Record<string, string>,
    usage_estimated: Number(row.usage_estimated) === 1,
    timestamp: row.provider_timestamp ?? row.completed_at,
    created_at: row.created_at,
  };
}

const idFilter = z.string().min(1).max(100).optional();
const customerFilter = customerRef.optional().describe('A customer id, or its reference_id');

/** Filters GET /requests and GET /usage share; each id filter has a name in both vocabularies. */
export const requestFilterQuery = {
  connection_id: customerFilter,
  customer_id: customerFilter.describe('Same filter as connection_id (newer name); a customer id or its reference_id'),
  product_id: idFilter,
  meter_id: idFilter.describe('Same filter as product_id (newer name)'),
  metadata_filters: z
    .string()
    .optional()
    .describe('JSON array of [key, value] string pairs, all of which must match, e.g. [["team","a"]]'),
};
export type FilterQuery = { [K in keyof typeof requestFilterQuery]?: string | undefined };

/** The list and usage filters; a customer may be named by its reference_id. */
export async function requestFiltersOf(db: Storage['db'], merchantId: string, query: FilterQuery): Promise<RequestFilters> {
  const pairs = query.metadata_filters;
  const customer = oneFilter(query, 'connection_id', 'customer_id');
  return {
    connectionId: customer === undefined ? undefined : await resolveCustomerId(db, merchantId, customer),
    meterId: oneFilter(query, 'product_id', 'meter_id'),
    metadata: pairs === undefined ? [] : parseJsonParam(pairs, metadataFiltersSchema, ['metadata_filters']),
  };
}

/** Both names of one filter may be sent, but then they must name the same thing. */
function oneFilter(query: FilterQuery, older: keyof FilterQuery, newer: keyof FilterQuery): string | undefined {
  const [a, b] = [query[older], query[newer]];
  if (a !== undefined && b !== undefined && a !== b) {
    throw validationError([{ path: [newer], message: `${newer} and ${older} are the same filter and must not differ` }]);
  }
  return b ?? a;
}

