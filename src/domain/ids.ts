import { randomBytes, randomFillSync } from 'node:crypto';
import { monotonicFactory } from 'ulid';

/**
 * ulid's own generator asks the system for randomness once per character (16 calls per new
 * millisecond); each is a system call. This one hands out bytes of a pool filled 4 KiB at a time.
 */
const pool = new Uint8Array(4096);
let poolAt = pool.length;
function pooledRandom(): number {
  if (poolAt >= pool.length) {
    randomFillSync(pool);
    poolAt = 0;
  }
  return pool[poolAt++]! / 256;
}

/**
 * Monotonic: ids made in the same millisecond still sort in creation order (lists rely on it),
 * and the factory draws randomness once per millisecond instead of per id, which is ~70x faster.
 */
const ulid = monotonicFactory(pooledRandom);

/** Every id carries a prefix naming its kind; the ULID body sorts by creation time. */
export const ID_PREFIX = {
  merchant: 'mer_',
  wallet: 'wal_',
  secretKey: 'sk_',
  meter: 'met_',
  connection: 'con_',
  request: 'req_',
  transaction: 'txn_',
  posting: 'pst_',
  hold: 'hld_',
  event: 'evt_',
  spendKey: 'spk_',
  walletKey: 'wk_',
  plan: 'pln_',
  creditBundle: 'cb_',
  subscription: 'sub_',
  paymentMethod: 'pm_',
  payment: 'pay_',
  refund: 'rfd_',
  checkoutSession: 'cs_',
  webhook: 'wh_',
  delivery: 'whd_',
  alert: 'alr_',
  alertFiring: 'alf_',
} as const;

export function newId(kind: keyof typeof ID_PREFIX): string {
  return ID_PREFIX[kind] + ulid();
}

/** Prefixes of secrets, so a leaked string tells what it unlocks. */
export const SECRET_PREFIX = {
  secretKey: 'sk_live_',
  connection: 'cons_',
  meter: 'mets_',
  spendKey: 'spk_live_',
  walletKey: 'wk_live_',
  checkoutSession: 'css_',
  webhook: 'whsec_',
  cliCode: 'cli_',
  session: 'sess_',
  passwordReset: 'pwr_',
} as const;

export function newSecret(kind: keyof typeof SECRET_PREFIX, bytes = 24): string {
  return SECRET_PREFIX[kind] + randomBytes(bytes).toString('base64url');
}
