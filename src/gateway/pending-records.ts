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
 * given up), so a reader that finds neither the entry nor the row is early, not late. The row is
 * built only when read: every forwarded request is added, few are ever looked up.
 */
export class PendingRecords {
  readonly #sources = new Map<string, PendingSource>();

  add({ requestId, admission, admittedAt }: PendingSource): void {
    // Only what the row is made from: the plan itself carries the request's body.
    this.#sources.set(keyOf(admission.billing.merchantId, requestId), { requestId, admission, admittedAt });
  }

  delete(source: PendingSource): void {
    this.#sources.delete(keyOf(source.admission.billing.merchantId, source.requestId));
  }

  find(merchantId: string, requestId: string): RequestRow | undefined {
    const source = this.#sources.get(keyOf(merchantId, requestId));
    return source && pendingRecord(source.admission, source.requestId, source.admittedAt);
  }

  get size(): number {
    return this.#sources.size;
  }
}

const keyOf = (merchantId: string, requestId: string) => `${merchantId}\n${requestId}`;
