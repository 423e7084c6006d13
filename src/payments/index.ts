import type { Config } from '../config.ts';
import { TestPaymentProvider } from './test-provider.ts';
import type { PaymentProvider } from './types.ts';

export type { PaymentProvider } from './types.ts';

/** The payment provider the configuration selects: the built-in `test` provider unless another is configured. */
export function createPaymentProvider(_config: Config): PaymentProvider {
  return new TestPaymentProvider();
}
