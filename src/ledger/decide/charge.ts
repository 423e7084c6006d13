/**
 * The charge rule, pure: what a request costs at its tier position, which wallets it may debit,
 * whether wallets without a hold can pay it, where its money goes, and which wallets it left
 * overrun. Every way of charging (a POST /requests charge alone or in a batch, a forwarded
 * request's settlement, a recovered estimate) decides with these.
 */
import { deserializeTiers } from '../../domain/meters.ts';
import { MAX_AMOUNT_UNITS } from '../../domain/money.ts';
import { baseCost, priceRequest, type BasePrices, type MeterPricing, type PricedRequest, type Usage } from '../../domain/pricing.ts';
import type { ConnectionRow } from '../../storage/connections.ts';
import type { MerchantRow } from '../../storage/merchants.ts';
import type { MeterRow } from '../../storage/meters.ts';
import type { RequestRow } from '../../storage/requests.ts';
import type { WalletsTable } from '../../storage/schema.ts';
import { merchantRevenueAccount, providerCostsAccount, serviceChargesAccount } from '../accounts.ts';
import type { Leg } from '../postings.ts';
import { availableFor, availableOf, drawsPlanCredit, type Unwritten } from './balance.ts';
import { overrunAfterCharge } from './overrun.ts';

type WalletRow = WalletsTable;

/** The facts a charge is decided from. */
export type ChargeInput = {
  merchant: Pick<MerchantRow, 'id' | 'wallet_id'>;
  /** Null for forwarded traffic billed to the merchant alone: the "wallet" parts fall to the merchant wallet. */
  connection: Pick<ConnectionRow, 'id' | 'wallet_id'> | null;
  /** Null when no meter prices the request (gateway mode): no fee, the merchant pays the base cost. */
  meter: MeterRow | null;
  /** Overrides the meter's pricing (billing disabled: attributed to the meter, priced as merchant-only). */
  pricing?: MeterPricing;
  /** The caller's id for the request (unique per merchant). */
  requestId: string;
  bodyHash: string | null;
  usage: Usage;
  provider: string;
  model: string | null;
  /** The model the request named, when the provider served it under another name. */
  requestedModel?: string | null;
  endpoint: string;
  providerKeyType: RequestRow['provider_key_type'];
  basePrices: BasePrices | null;
  /** Default: charged when prices are known and the provider key is ours (managed). */
  baseCostCharged?: boolean;
  serviceChargeRate: bigint;
  metadata: Record<string, string>;
  responseId?: string | null;
  providerTimestamp?: string | null;
  usageEstimated?: boolean;
  /**
   * A forwarded request settles against the hold placed at admission: the hold is released and the
   * actual cost charged even if it exceeds what is available. Without a hold (POST /requests) a
   * charge that the paying wallets cannot cover is refused and nothing is written.
   */
  holdId?: string;
  holdIds?: string[];
  /** Completes the pending record written at admission instead of inserting a new one. */
  pendingRecordId?: string;
  /**
   * The customer's usage is on a meter linked to the plan of its live subscription: it draws cycle
   * credit, then bundle credit, then the prepaid balance. Absent or false: the prepaid balance
   * only, and only that is available to it (decision 0016). A charge batch (POST /requests)
   * decides it itself, under its locks.
   */
  drawsPlanCredit?: boolean;
  /** When the request was admitted, for a record written first at admission (default: the charge's time). */
  createdAt?: string;
  /** The app's holds admitted in process and not written yet (SQLite), which a charge without a hold must leave. */
  unwritten?: Unwritten;
  now: Date;
};

/** Pricing of traffic no meter prices: no fee, no service charge, the merchant pays the base cost. */
export const MERCHANT_ONLY_PRICING: MeterPricing = {
  rateType: 'fixed',
  tierType: 'tokens_1m',
  tokenBasis: 'input+output',
  baseCostPayer: 'merchant',
  serviceChargePayer: 'merchant',
  tiers: [{ start: 0, rate: 0n }],
};

/** The wallets a posted charge debited (one when the customer's is the merchant's). */
export function walletsDebitedBy(priced: PricedRequest, customerWallet: WalletRow, merchantWallet: WalletRow | undefined): WalletRow[] {
  const debited: WalletRow[] = [];
  if (priced.totals.wallet !== 0n) debited.push(customerWallet);
  if (merchantWallet && priced.totals.merchant !== 0n && !debited.includes(merchantWallet)) debited.push(merchantWallet);
  return debited;
}

/** The wallet that pays the "wallet" parts: the customer's, or the merchant's when there is no customer. */
export function payerWalletOf(input: Pick<ChargeInput, 'connection' | 'merchant'>): string {
  return input.connection?.wallet_id ?? input.merchant.wallet_id;
}

function pricingOf(input: ChargeInput): MeterPricing {
  return input.pricing ?? (input.meter ? meterPricing(input.meter) : MERCHANT_ONLY_PRICING);
}

function baseCostChargedOf(input: ChargeInput): boolean {
  return input.baseCostCharged ?? (input.basePrices !== null && input.providerKeyType === 'managed');
}

/**
 * Whether any price of this request can fall on the merchant's wallet: only the base cost and the
 * service charge can, when the meter names the merchant as their payer (the fee is always the
 * wallet's). Known before the tier position is, so a batch can lock just the wallets it may debit.
 */
export function mayChargeMerchantWallet(input: ChargeInput): boolean {
  const pricing = pricingOf(input);
  if (payerWalletOf(input) === input.merchant.wallet_id) return true;
  const baseOnMerchant = pricing.baseCostPayer === 'merchant' && input.basePrices !== null && baseCostChargedOf(input);
  const serviceChargeOnMerchant = pricing.serviceChargePayer === 'merchant' && input.serviceChargeRate > 0n;
  return baseOnMerchant || serviceChargeOnMerchant;
}

/** Prices the request at the given tier position; pure. */
export function priceCharge(input: ChargeInput, accumulated: bigint): PricedRequest | 'amount_too_large' {
  const base = input.basePrices
    ? baseCost(input.basePrices, input.usage)
    : { input: 0n, output: 0n, total: 0n };
  const priced = priceRequest({
    meter: pricingOf(input),
    usage: input.usage,
    baseCost: base,
    accumulatedUnits: accumulated,
    serviceChargeRate: input.serviceChargeRate,
    baseCostCharged: baseCostChargedOf(input),
  });
  if (priced.totals.request > MAX_AMOUNT_UNITS || priced.baseCost.total > MAX_AMOUNT_UNITS) return 'amount_too_large';
  return priced;
}

/** What a charge without a hold lacks: whose wallet, how much it needs and what it has available (a 402). */
export type BalanceShortfall = { payer: 'wallet' | 'merchant'; needed: bigint; available: bigint };

/**
 * Why the paying wallets cannot take this charge without a hold, or null when they can. The
 * merchant's wallet may be absent only when the merchant's part is zero. The customer's wallet
 * offers its plan credit only to usage that draws it (availableFor).
 */
export function balanceShortfall(
  priced: PricedRequest,
  customerWallet: WalletRow,
  merchantWallet: WalletRow | undefined,
  facts: Pick<ChargeInput, 'unwritten' | 'drawsPlanCredit'>,
): BalanceShortfall | null {
  const sameWallet = customerWallet === merchantWallet;
  const walletPart = priced.totals.wallet + (sameWallet ? priced.totals.merchant : 0n);
  const walletRefusal = shortfall(availableFor(customerWallet, facts.unwritten, drawsPlanCredit(facts)), walletPart, 'wallet');
  if (walletRefusal || sameWallet || priced.totals.merchant === 0n) return walletRefusal;
  if (!merchantWallet) throw new Error('a charge on the merchant wallet without its lock');
  return shortfall(availableOf(merchantWallet, facts.unwritten), priced.totals.merchant, 'merchant');
}

function shortfall(available: bigint, needed: bigint, payer: 'wallet' | 'merchant'): BalanceShortfall | null {
  if (needed === 0n || available >= needed) return null;
  return { payer, needed, available };
}

/** Where a charge's money goes besides the wallets it debits. */
export type ChargeCredits = { providerCost: bigint; merchantRevenue: bigint; serviceCharge: bigint };

export function chargeCreditsOf(priced: PricedRequest): ChargeCredits {
  return { providerCost: priced.baseCost.charged ? priced.baseCost.total : 0n, merchantRevenue: priced.fee.amount, serviceCharge: priced.serviceCharge.amount };
}

/** A charge's ledger legs: the wallets' debits, and provider costs, merchant revenue and service charges credited. */
export function chargeLegs(merchantId: string, credits: ChargeCredits, walletDebits: Leg[]): Leg[] {
  return [
    ...walletDebits,
    { account: providerCostsAccount(merchantId), amount: credits.providerCost },
    { account: merchantRevenueAccount(merchantId), amount: credits.merchantRevenue },
    { account: serviceChargesAccount(), amount: credits.serviceCharge },
  ];
}

/** Parsed once per meter row read: every request of a batch shares its meter's row. */
const pricingOfRow = new WeakMap<MeterRow, MeterPricing>();

export function meterPricing(meter: MeterRow): MeterPricing {
  let pricing = pricingOfRow.get(meter);
  if (!pricing) {
    pricing = parseMeterPricing(meter);
    pricingOfRow.set(meter, pricing);
  }
  return pricing;
}

function parseMeterPricing(meter: MeterRow): MeterPricing {
  return {
    rateType: meter.rate_type,
    tierType: meter.tier_type,
    tokenBasis: meter.token_basis,
    baseCostPayer: meter.base_cost_payer,
    serviceChargePayer: meter.service_charge_payer,
    tiers: deserializeTiers(meter.tiers),
  };
}

/**
 * The wallets a settled request cost more than it held on them, each with the overrun it leaves
 * (overrunAfterCharge): while requests are in flight on them, admissions count what those may cost
 * beyond their holds (admittableOf). A request with nothing held is not one.
 */
export function overrunWallets(price: PricedRequest, customerWallet: WalletRow, merchantWallet: WalletRow, heldOn: (wallet: WalletRow) => bigint): [WalletRow, number][] {
  const costOn = (wallet: WalletRow) => (wallet === customerWallet ? price.totals.wallet : 0n) + (wallet === merchantWallet ? price.totals.merchant : 0n);
  return [...new Set([customerWallet, merchantWallet])].flatMap((wallet): [WalletRow, number][] => {
    const overrun = overrunAfterCharge(costOn(wallet), heldOn(wallet), wallet.overrun);
    return overrun === null ? [] : [[wallet, overrun]];
  });
}
