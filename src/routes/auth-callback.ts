import { z } from 'zod';
import { ApiError } from '../http/errors.ts';
import { errorResponse } from '../http/schemas.ts';
import { nowOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { exchangeCliCode } from '../storage/cli-codes.ts';

const body = z.object({ code: z.string().min(1).max(200) });

const credentials = z.object({
  merchant_id: z.string(),
  account_id: z.string().describe('The merchant id again (newer clients read account_id)'),
  wallet_id: z.string().describe("The merchant's own wallet"),
  secret_key_id: z.string(),
  secret_key: z.string().describe('A new secret key, shown only once'),
  wallet_key_id: z.string().describe("A new wallet key on the merchant's wallet (older clients)"),
  wallet_key: z.string(),
});

const OUTCOME_ERRORS = { unknown: 'auth_code_invalid', used: 'auth_code_used', expired: 'auth_code_expired' } as const;

/** `{"code": "…"}`: a body of a few dozen bytes; more is refused unread. */
const CALLBACK_BODY_LIMIT = 4 * 1024;

/** Per client address: the code has 256 random bits, this only keeps floods off the database. */
const EXCHANGES_PER_MINUTE = 60;

/**
 * The second half of the CLI login (`Lava.login()`, `tollgate login`): the one-time code the browser
 * handed to the CLI's loopback listener becomes credentials. No API key: the code is the credential.
 */
export function registerAuthCallbackRoute(app: App, deps: AppDeps): void {
  app.post(
    '/auth/callback',
    {
      config: { public: true },
      bodyLimit: CALLBACK_BODY_LIMIT,
      schema: {
        tags: ['auth'],
        security: [],
        description: 'Exchanges a one-time CLI authorization code (60 s, single use) for a new secret key. Bodies over 4 KiB are refused (413 payload_too_large).',
        body,
        response: {
          200: credentials,
          400: errorResponse('`auth_code_invalid`, `auth_code_used`, `auth_code_expired`, or a malformed body'),
          429: errorResponse('Too many exchanges from this address'),
        },
      },
    },
    async (request) => {
      const decision = await deps.rateLimiter.hit(`auth-callback:${request.ip}`, EXCHANGES_PER_MINUTE, 60_000, nowOf(deps));
      if (!decision.allowed) throw new ApiError('rate_limited', 'Too many code exchanges from this address; wait a minute.');
      const result = await exchangeCliCode(deps.storage, request.body.code, nowOf(deps));
      if (result.outcome !== 'ok') throw new ApiError(OUTCOME_ERRORS[result.outcome]);
      const c = result.credentials;
      return {
        merchant_id: c.merchantId,
        account_id: c.merchantId,
        wallet_id: c.walletId,
        secret_key_id: c.secretKeyId,
        secret_key: c.secretKey,
        wallet_key_id: c.walletKeyId,
        wallet_key: c.walletKey,
      };
    },
  );
}
