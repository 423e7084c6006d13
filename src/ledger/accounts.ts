/**
 * Ledger account names. A wallet has one account per bucket; money leaves the system to the
 * provider, the merchant's revenue and the operator's service charges, and enters it from grants,
 * operator credits and payments.
 */
export type Bucket = 'cycle' | 'bundle' | 'prepaid';

/** Consumption order: subscription cycle credit first, then bundle credit, then prepaid balance. */
export const BUCKET_ORDER: readonly Bucket[] = ['cycle', 'bundle', 'prepaid'];

export const walletAccount = (walletId: string, bucket: Bucket) => `wallet:${walletId}:${bucket}`;
export const providerCostsAccount = (merchantId: string) => `provider_costs:${merchantId}`;
export const merchantRevenueAccount = (merchantId: string) => `merchant_revenue:${merchantId}`;
export const serviceChargesAccount = () => 'platform:service_charges';
export const creditGrantsAccount = (merchantId: string) => `credit_grants:${merchantId}`;
export const operatorFundingAccount = () => 'operator:funding';
/** Money customers paid through a payment provider (checkout, bundles, auto top-up). */
export const customerPaymentsAccount = (merchantId: string) => `customer_payments:${merchantId}`;
/** Cycle credit a subscription plan grants each cycle. */
export const planCreditAccount = (merchantId: string) => `plan_credit:${merchantId}`;
/** Cycle or bundle credit that expired at a cycle's end (rollover `none`) or a cancellation. */
export const expiredCreditAccount = (merchantId: string) => `expired_credit:${merchantId}`;

export function parseWalletAccount(account: string): { walletId: string; bucket: Bucket } | null {
  const m = /^wallet:([^:]+):(cycle|bundle|prepaid)$/.exec(account);
  return m ? { walletId: m[1]!, bucket: m[2] as Bucket } : null;
}
