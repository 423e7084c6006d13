import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { registerCustomerReadRoutes } from './customers.ts';

/** The older vocabulary: a connection is the same object as a customer, with the same `con_` id. */
export function registerConnectionRoutes(app: App, deps: AppDeps): void {
  registerCustomerReadRoutes(app, deps, '/connections', ['connections (older vocabulary)']);
}
