import type { Config } from '../config.ts';
import { StripePaymentProvider } from './stripe.ts';
import { TestPaymentProvider } from './test-provider.ts';
import type { PaymentProvider } from './types.ts';

export type { PaymentProvider } from './types.ts';

/** The payment provider the configuration selects: Stripe when its keys are set, else the built-in `test` provider. */
export function createPaymentProvider(config: Pick<Config, 'stripe'>): PaymentProvider {
  return config.stripe ? new StripePaymentProvider(config.stripe) : new TestPaymentProvider();
}
