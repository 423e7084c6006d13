/**
 * Admission in the database, the reference every fast path is tested against: hold the estimate
 * on each paying wallet and write the pending record, a group-commit batch member by member
 * (admitInTransaction; one request alone is a batch of one, admitRequest), or a whole batch in
 * one statement when every member fits (PostgreSQL).
 */
import type { Transaction } from 'kysely';
import type { BatchJob } from '../group-commit.ts';
import {
  isSpendKeyRefusal,
  lockSpendKeyForAdmission,
  lockSpendKeys,
  reserveForRequest,
  type SpendKeyRefusal,
  type SpendKeyRequest,
} from '../spend-key-limits.ts';
import type { Storage } from '../../storage/db.ts';
import type { Database } from '../../storage/schema.ts';
import type { RequestRow } from '../../storage/requests.ts';
import { holdRowsOf, type HoldRow } from '../holds.ts';
import { lockWallets, type UnwrittenHolds, type WalletRow } from '../wallets.ts';
import { admittableOf, holdParts, overrunsEnded, refusedPart, type HoldPart } from '../decide/admission.ts';
import { drawsPlanCredit } from '../decide/balance.ts';
import { pricingFor, type BillingContext } from '../billing.ts';
import { writeAdmissionRows } from './rows.ts';
import { admitWholeBatch, type AdmissionBatch } from '../store/postgres.ts';
import type { EstimatedCharge } from '../settlement/recover.ts';

export type AdmitInput = {
  requestId: string;
  billing: BillingContext;
  walletId: string;
  /** `charge`: what the hold was estimated from, kept on the pending record for recovery (recover.ts). */
  estimate: { wallet: bigint; merchant: bigint; charge?: EstimatedCharge };
  ttlMs: number;
  record: Pick<RequestRow, 'provider' | 'model' | 'endpoint' | 'provider_key_type'> & { metadata: Record<string, string> };
  /** What a spend key's checks are run against again on its locked row. */
  spendKeyRequest?: SpendKeyRequest;
  /** The app's holds admitted in process and not written yet (SQLite), which the decision subtracts. */
  unwritten?: UnwrittenHolds;
  now: Date;
};

export type AdmitOutcome =
  /** `createdAt`: the pending record's time, which the settled record keeps (and rolls up under). */
  | { outcome: 'admitted'; recordId: string; holdIds: string[]; createdAt: string }
  | { outcome: 'insufficient_balance'; payer: 'wallet' | 'merchant' }
  | { outcome: 'spend_key_refused'; refusal: SpendKeyRefusal };

/**
 * Holds the estimate on each paying wallet and writes the pending record, in one transaction: a
 * batch of one (admitInTransaction). Refused (nothing written) when a paying wallet cannot cover
 * its part, or when a wallet that would pay anything is at or below zero.
 */
export async function admitRequest(storage: Storage, input: AdmitInput): Promise<AdmitOutcome> {
  const [outcome] = await storage.db.transaction().execute((trx) => admitInTransaction(trx, storage.dialect, [input]));
  return outcome!;
}

/** Nothing was in flight on these overrun wallets: the overrun ends with this admission (decision 0019). */
async function endOverruns(trx: Transaction<Database>, walletIds: string[], wallets: Map<string, WalletRow>): Promise<void> {
  if (walletIds.length === 0) return;
  for (const walletId of walletIds) wallets.get(walletId)!.overrun = 0;
  await trx.updateTable('wallets').set({ overrun: 0 }).where('id', 'in', walletIds).execute();
}

/** The request's spend key, locked and checked again on its row; null without one. */
function lockedSpendKey(trx: Transaction<Database>, dialect: Storage['dialect'], input: AdmitInput, now: Date) {
  const key = input.billing.spendKey;
  return key ? lockSpendKeyForAdmission(trx, dialect, { key, request: input.spendKeyRequest ?? null, now }) : Promise.resolve(null);
}

/**
 * Admission of several requests in one transaction (group commit): each decided in the order
 * given against the wallets as each earlier request left them, with each table written once. Only the wallets that take a hold are locked (every customer's request names the
 * merchant's wallet; locking it always would queue them all behind one row), then the spend keys,
 * both in id order. A refusal changes nothing of its own request; the others go on.
 */
export async function admitInTransaction(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  inputs: AdmitInput[],
): Promise<AdmitOutcome[]> {
  const partsOf = inputs.map(holdPartsOf);
  const walletIds = partsOf.flatMap((parts) => parts.map((p) => p.walletId));
  const wallets = walletIds.length > 0 ? await lockWallets(trx, dialect, walletIds) : new Map<string, WalletRow>();
  await lockSpendKeys(trx, dialect, spendKeyIdsOf(inputs));

  const outcomes: AdmitOutcome[] = [];
  const holds: HoldRow[] = [];
  const records: RequestRow[] = [];
  for (const [i, input] of inputs.entries()) {
    const parts = partsOf[i]!;
    const now = input.now;
    const key = await lockedSpendKey(trx, dialect, input, now);
    if (key && isSpendKeyRefusal(key)) {
      outcomes.push({ outcome: 'spend_key_refused', refusal: key });
      continue;
    }
    const refused = refusedPart(parts, (walletId, amount) => admittableOf(wallets.get(walletId)!, input.unwritten, drawsPlanCredit(input.billing), amount));
    if (refused) {
      outcomes.push({ outcome: 'insufficient_balance', payer: refused.payer });
      continue;
    }
    const recordId = input.requestId;
    if (key) {
      const refusal = await reserveForRequest(trx, key, { recordId, amount: input.estimate.wallet + input.estimate.merchant, now });
      if (refusal) {
        outcomes.push({ outcome: 'spend_key_refused', refusal });
        continue;
      }
    }
    await endOverruns(trx, overrunsEnded(parts, (walletId) => wallets.get(walletId), input.unwritten), wallets);
    const createdAt = now.toISOString();
    const rows = holdRowsOf(parts, recordId, now, input.ttlMs);
    for (const hold of rows) wallets.get(hold.wallet_id)!.held += hold.amount;
    holds.push(...rows);
    records.push(pendingRecord(input, recordId, createdAt));
    outcomes.push({ outcome: 'admitted', recordId, holdIds: rows.map((hold) => hold.id), createdAt });
  }

  await writeAdmissionRows(trx, holds, records);
  return outcomes;
}

/**
 * PostgreSQL fast path for a batch of admissions: the holds decided in process, admitted in one
 * statement only when every paying wallet covers everything the batch holds on it (from its
 * prepaid balance alone when any member may not draw plan credit), so every member passes
 * admitInTransaction's check in any order (ledger/store/postgres.ts admitWholeBatch). Otherwise nothing
 * is written and the batch takes the ordinary path, which decides member by member. Spend-key
 * requests always take the ordinary path.
 */
async function admitInOneStatement(storage: Storage, inputs: AdmitInput[]): Promise<AdmitOutcome[] | null> {
  if (storage.dialect !== 'postgres' || inputs.some((input) => input.billing.spendKey)) return null;
  const batch: AdmissionBatch = { need: new Map(), prepaidOnly: new Set(), holds: [], records: [] };
  const outcomes: AdmitOutcome[] = [];
  for (const input of inputs) {
    const now = input.now;
    const createdAt = now.toISOString();
    const rows = holdRowsOf(holdPartsOf(input), input.requestId, now, input.ttlMs);
    for (const hold of rows) batch.need.set(hold.wallet_id, (batch.need.get(hold.wallet_id) ?? 0n) + hold.amount);
    if (!drawsPlanCredit(input.billing)) batch.prepaidOnly.add(input.walletId);
    batch.holds.push(...rows);
    batch.records.push(pendingRecord(input, input.requestId, createdAt));
    outcomes.push({ outcome: 'admitted', recordId: input.requestId, holdIds: rows.map((hold) => hold.id), createdAt });
  }
  if (batch.need.size === 0) return null;
  return (await admitWholeBatch(storage, batch)) ? outcomes : null;
}

/** Admission as a group-commit job (ledger/group-commit.ts). */
export const ADMIT_JOB: BatchJob<AdmitInput, AdmitOutcome> = {
  order: 1,
  locks: (_trx, inputs) => ({ walletIds: inputs.flatMap(payingWalletIds), spendKeyIds: spendKeyIdsOf(inputs) }),
  inTransaction: admitInTransaction,
  wholeBatch: admitInOneStatement,
  alone: admitRequest,
};

/** An admission's hold parts (ledger/decide/admission.ts holdParts): its wallet's and the merchant's shares of its estimate. */
export const holdPartsOf = (input: AdmitInput): HoldPart[] => holdParts(input.walletId, input.billing.merchantWalletId, input.estimate);

/** The wallets an admission holds anything on. */
export const payingWalletIds = (input: AdmitInput): string[] => holdPartsOf(input).map((part) => part.walletId);

export function pendingRecord(input: AdmitInput, id: string, at: string): RequestRow {
  const { pricing, meterPriced } = pricingFor(input.billing);
  return {
    id,
    merchant_id: input.billing.merchantId,
    request_id: id,
    body_hash: null,
    status: 'pending',
    connection_id: input.billing.connection?.id ?? null,
    meter_id: input.billing.meter?.id ?? null,
    provider: input.record.provider,
    model: input.record.model,
    requested_model: null,
    endpoint: input.record.endpoint,
    provider_key_type: input.record.provider_key_type,
    response_id: null,
    provider_timestamp: null,
    metadata: JSON.stringify(input.record.metadata),
    input_tokens: 0n,
    output_tokens: 0n,
    cached_input_tokens: 0n,
    cache_write_input_tokens: 0n,
    reasoning_tokens: 0n,
    output_images: 0n,
    price_unit: null,
    input_characters: 0n,
    output_characters: 0n,
    input_seconds: '0',
    output_seconds: '0',
    input_cost: 0n,
    output_cost: 0n,
    base_cost_charged: 0,
    base_cost_payer: pricing.baseCostPayer,
    fee_amount: 0n,
    rate_type: pricing.rateType,
    token_basis: pricing.tokenBasis,
    breakdown: '[]',
    service_charge_amount: 0n,
    service_charge_payer: pricing.serviceChargePayer,
    total_request_cost: 0n,
    total_wallet_cost: 0n,
    total_merchant_cost: 0n,
    usage_estimated: 0,
    hold_estimate: input.estimate.charge
      ? JSON.stringify({
          ...input.estimate.charge,
          payer_wallet_id: input.walletId,
          merchant_wallet_id: input.billing.merchantWalletId,
          draws_plan_credit: drawsPlanCredit(input.billing),
          meter_priced: meterPriced,
        })
      : null,
    created_at: at,
    completed_at: null,
  };
}

/** The spend keys requests name (admissions and settlements know theirs). */
export function spendKeyIdsOf(inputs: { billing: BillingContext }[]): string[] {
  return inputs.flatMap((input) => (input.billing.spendKey ? [input.billing.spendKey.id] : []));
}
