import { pendingRecord, type AdmitInput } from '../ledger/admission/admit.ts';
import type { RequestRow } from '../storage/requests.ts';

/** What a forwarded request's record is made from, as its plan carries it. */
export type PendingSource = { requestId: string; admission: AdmitInput; admittedAt: string };

/**
 * The records of forwarded requests this process admitted whose settlement has not committed yet.
 * An admission decided in process (SQLite, or PostgreSQL wallet leases) writes its pending record
 * later, or never when the settlement takes it over (decision 0011); until the record is in the
 * database, GET /v1/requests/{id} answers from here, with the same pending record the database
 * would hold. An entry lives from admission until the settlement's write has committed (or was
 * given up), so a reader that finds neither the entry nor the row is early, not late.
 */
export class PendingRecords {
  readonly #rows = new Map<string, RequestRow>();

  add(source: PendingSource): void {
    const row = pendingRecord(source.admission, source.requestId, source.admittedAt);
    this.#rows.set(keyOf(row.merchant_id, row.request_id), row);
  }

  delete(source: PendingSource): void {
    this.#rows.delete(keyOf(source.admission.billing.merchantId, source.requestId));
  }

  find(merchantId: string, requestId: string): RequestRow | undefined {
    return this.#rows.get(keyOf(merchantId, requestId));
  }

  get size(): number {
    return this.#rows.size;
  }
}

const keyOf = (merchantId: string, requestId: string) => `${merchantId}\n${requestId}`;
