import { principalOf } from '../http/auth.ts';
import { notFound } from '../http/errors.ts';
import { pageResponse } from '../http/pagination.ts';
import { customerParams, errorResponse, standardErrors, successResponse } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { dateOf } from '../domain/clock.ts';
import {
  changeCustomer,
  createCustomer,
  customerCreateBody,
  customerCreditBody,
  customerCreditSchema,
  customerListQuery,
  customerSchema,
  customerUpdateBody,
  deleteCustomer,
  getCustomer,
  grantCustomerCredit,
  listCustomerPage,
  presentWithSubscription,
} from '../services/customers.ts';

const tags = ['customers'];

export function registerCustomerRoutes(app: App, deps: AppDeps): void {
  app.post(
    '/customers',
    {
      schema: {
        tags,
        description:
          'Creates a customer (201). Idempotent on `reference_id`: when a customer already has it, that customer is returned unchanged (200) and the other fields are ignored.',
        body: customerCreateBody,
        response: { 201: customerSchema.describe('Created'), 200: customerSchema.describe('The customer that already has this reference_id'), ...standardErrors },
      },
    },
    async (request, reply) => {
      const { customer, created } = await createCustomer(deps, principalOf(request).merchantId, request.body);
      return reply.status(created ? 201 : 200).send(customer);
    },
  );

  registerCustomerReadRoutes(app, deps, '/customers', tags);

  app.post(
    '/customers/:id/credits',
    {
      schema: {
        tags,
        params: customerParams,
        body: customerCreditBody,
        response: {
          201: customerCreditSchema,
          ...standardErrors,
          422: errorResponse('`wallet_balance_limit`: the grant would take the wallet balance above 100000000, its maximum; nothing was credited'),
        },
      },
    },
    async (request, reply) => {
      const credit = await grantCustomerCredit(deps, principalOf(request).merchantId, request.params.id, request.body);
      return reply.status(201).send(credit);
    },
  );

  app.patch(
    '/customers/:id',
    {
      schema: {
        tags,
        params: customerParams,
        body: customerUpdateBody,
        response: { 200: customerSchema, ...standardErrors, 409: errorResponse('`reference_id_taken`: another customer of this merchant already uses this reference_id') },
      },
    },
    async (request) => changeCustomer(deps, principalOf(request).merchantId, request.params.id, request.body),
  );
}

/** List, retrieve and delete: the same handlers serve /customers and the older /connections. */
export function registerCustomerReadRoutes(app: App, deps: AppDeps, base: string, tags: string[]): void {
  const { storage } = deps;
  const noun = base === '/customers' ? 'customer' : 'connection';

  app.get(
    base,
    { schema: { tags, querystring: customerListQuery, response: { 200: pageResponse(customerSchema), ...standardErrors } } },
    async (request) => listCustomerPage(deps, principalOf(request).merchantId, request.query),
  );

  app.get(
    `${base}/:id`,
    { schema: { tags, params: customerParams, response: { 200: customerSchema, ...standardErrors } } },
    async (request) => {
      const row = await getCustomer(storage, principalOf(request).merchantId, request.params.id, noun);
      return presentWithSubscription(storage, row, dateOf(deps.clock));
    },
  );

  app.delete(
    `${base}/:id`,
    { schema: { tags, params: customerParams, response: { 200: successResponse, ...standardErrors } } },
    async (request) => {
      if (!(await deleteCustomer(deps, principalOf(request).merchantId, request.params.id))) throw notFound(noun, request.params.id);
      return { success: true as const };
    },
  );
}

/** The older vocabulary: a connection is the same object as a customer, with the same `con_` id. */
export function registerConnectionRoutes(app: App, deps: AppDeps): void {
  registerCustomerReadRoutes(app, deps, '/connections', ['connections (older vocabulary)']);
}
