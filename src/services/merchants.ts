/**
 * Merchant accounts as the operator runs them (`tollgate admin …`): creating one with its wallet
 * and first secret key, its dashboard sign-in (password, email, a one-time reset link) and its
 * service-charge rate. Every login these make follows the rules the dashboard's own forms
 * follow: a valid email, unique among merchants, and a password of MIN_PASSWORD_LENGTH or more.
 */
import type { AppDeps } from '../app-deps.ts';
import { dateOf } from '../domain/clock.ts';
import { isValidEmail } from '../domain/email.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { createMerchant, findMerchant, MIN_PASSWORD_LENGTH, normalizedEmail, setMerchantEmail, setMerchantLogin, setServiceChargeRate, type MerchantRow } from '../storage/merchants.ts';
import { createPasswordReset, PASSWORD_RESET_TTL_MS } from '../storage/password-resets.ts';
import { deleteMerchantSessions } from '../storage/sessions.ts';

type Deps = Pick<AppDeps, 'storage' | 'clock'>;

/** The issue of a sign-in asked for a merchant that has no email and was given none. */
export const NO_EMAIL = 'is required: the merchant has none';

export { MIN_PASSWORD_LENGTH, PASSWORD_RESET_TTL_MS };

/** A merchant with its wallet and first secret key (shown this once). Email and password go together. */
export async function createMerchantAccount(
  deps: Deps,
  fields: { name: string; email?: string | undefined; password?: string | undefined },
): Promise<{ merchant: MerchantRow; secretKey: string }> {
  if (fields.email !== undefined) checkEmail(fields.email);
  if (fields.password !== undefined) checkPassword(fields.password);
  const login = fields.email === undefined ? {} : { email: fields.email.trim(), password: fields.password };
  const created = await createMerchant(deps.storage, { name: fields.name, ...login }, dateOf(deps.clock).toISOString()).catch((e: unknown) => {
    // The only unique value a new merchant brings is its email.
    if (isUniqueViolation(e)) throw new ApiError('conflict', `A merchant with the email ${normalizedEmail(fields.email!)} already exists.`);
    throw e;
  });
  return { merchant: created.merchant, secretKey: created.secretKey };
}

/**
 * Sets a merchant's dashboard password (and its sign-in email, when given) and signs it out
 * everywhere: whoever held a session under the old password is out. Answers the email it signs
 * in with.
 */
export async function setMerchantPassword(deps: Deps, merchantId: string, login: { password: string; email?: string | undefined }): Promise<string> {
  if (login.email !== undefined) checkEmail(login.email);
  checkPassword(login.password);
  const merchant = await merchantWithEmail(deps, merchantId, login.email);
  const change = { password: login.password, ...(login.email === undefined ? {} : { email: login.email }) };
  await setMerchantLogin(deps.storage.db, merchantId, change).catch(emailTaken(login.email));
  await deleteMerchantSessions(deps.storage, merchantId);
  return login.email === undefined ? merchant.email! : normalizedEmail(login.email);
}

/**
 * A one-time token with which the merchant chooses a new password (valid PASSWORD_RESET_TTL_MS);
 * `email` is set first, and is needed when the merchant has none.
 */
export async function passwordResetToken(deps: Deps, merchantId: string, email?: string): Promise<string> {
  if (email !== undefined) checkEmail(email);
  await merchantWithEmail(deps, merchantId, email);
  if (email !== undefined) await setMerchantEmail(deps.storage, merchantId, email).catch(emailTaken(email));
  return createPasswordReset(deps.storage, merchantId, deps.clock.now());
}

/** The merchant's own service-charge rate (percent of the fee, 1e-10 units), or null for the operator's default. */
export async function setMerchantServiceCharge(deps: Deps, merchantId: string, rate: bigint | null): Promise<void> {
  if (!(await setServiceChargeRate(deps.storage, merchantId, rate))) throw notFound('merchant', merchantId);
}

/** A sign-in needs an email: the merchant's own, or one given now. */
async function merchantWithEmail(deps: Deps, merchantId: string, email: string | undefined): Promise<MerchantRow> {
  const merchant = await findMerchant(deps.storage, merchantId);
  if (!merchant) throw notFound('merchant', merchantId);
  if (!merchant.email && email === undefined) {
    throw new ApiError('validation_error', `Merchant ${merchantId} has no sign-in email; give one.`, { issues: [{ path: ['email'], message: NO_EMAIL }] });
  }
  return merchant;
}

function checkEmail(email: string): void {
  if (!isValidEmail(email.trim())) {
    throw new ApiError('validation_error', `${email} is not a valid email address.`, { issues: [{ path: ['email'], message: 'is not a valid email address' }] });
  }
}

function checkPassword(password: string): void {
  if (password.length < MIN_PASSWORD_LENGTH) {
    const message = `must have at least ${MIN_PASSWORD_LENGTH} characters`;
    throw new ApiError('validation_error', `The password ${message}.`, { issues: [{ path: ['password'], message }] });
  }
}

const emailTaken = (email: string | undefined) => (e: unknown): never => {
  if (isUniqueViolation(e)) throw new ApiError('conflict', `Another merchant already signs in with ${normalizedEmail(email ?? '')}.`);
  throw e;
};
