import { randomBytes, timingSafeEqual } from 'node:crypto';
import type {} from '@fastify/cookie';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { nowOf } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { createSession, deleteSession, findSession, type Session } from '../storage/sessions.ts';

const SESSION_COOKIE = 'tollgate_session';
/** Before sign-in there is no session to hold a CSRF token: a signed double-submit cookie does. */
const CSRF_COOKIE = 'tollgate_csrf';
const SESSION_TTL_MS = 12 * 60 * 60_000;

declare module 'fastify' {
  interface FastifyRequest {
    /** The dashboard sign-in this request carries, once loadSession has run. */
    dashboardSession?: Session | null;
  }
}

/** A page or form refused for a reason the visitor can act on; rendered as an HTML page. */
export class WebError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

function cookieOptions(request: FastifyRequest, maxAgeSeconds: number) {
  return {
    path: '/',
    httpOnly: true,
    sameSite: 'lax' as const,
    secure: request.protocol === 'https',
    signed: true,
    maxAge: maxAgeSeconds,
  };
}

function signedCookie(request: FastifyRequest, name: string): string | null {
  const raw = request.cookies[name];
  if (!raw) return null;
  const unsigned = request.unsignCookie(raw);
  return unsigned.valid ? unsigned.value : null;
}

export async function loadSession(deps: AppDeps, request: FastifyRequest): Promise<Session | null> {
  if (request.dashboardSession !== undefined) return request.dashboardSession;
  const token = signedCookie(request, SESSION_COOKIE);
  request.dashboardSession = (token && (await findSession(deps.storage, token, nowOf(deps)))) || null;
  return request.dashboardSession;
}

export async function startSession(deps: AppDeps, request: FastifyRequest, reply: FastifyReply, merchantId: string): Promise<void> {
  const { token, session } = await createSession(deps.storage, merchantId, nowOf(deps), SESSION_TTL_MS);
  reply.setCookie(SESSION_COOKIE, token, cookieOptions(request, SESSION_TTL_MS / 1000));
  request.dashboardSession = session;
}

export async function endSession(deps: AppDeps, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  const token = signedCookie(request, SESSION_COOKIE);
  if (token) await deleteSession(deps.storage, token);
  reply.clearCookie(SESSION_COOKIE, { path: '/' });
  request.dashboardSession = null;
}

/** The token this visitor's forms must carry: the session's, or a double-submit cookie's. */
export function csrfTokenFor(request: FastifyRequest, reply: FastifyReply): string {
  if (request.dashboardSession) return request.dashboardSession.csrfToken;
  const existing = signedCookie(request, CSRF_COOKIE);
  if (existing) return existing;
  const token = randomBytes(24).toString('base64url');
  reply.setCookie(CSRF_COOKIE, token, cookieOptions(request, SESSION_TTL_MS / 1000));
  return token;
}

/** Every state-changing form posts `_csrf`; a missing or wrong one is refused before anything happens. */
export function assertCsrf(request: FastifyRequest): void {
  const sent = (request.body as Record<string, unknown> | undefined)?._csrf;
  const expected = request.dashboardSession ? request.dashboardSession.csrfToken : signedCookie(request, CSRF_COOKIE);
  if (typeof sent !== 'string' || !expected || !sameText(sent, expected)) {
    throw new WebError(403, 'This form is out of date or did not come from this site. Reload the page and try again.');
  }
}

function sameText(a: string, b: string): boolean {
  const ab = Buffer.from(a);
  const bb = Buffer.from(b);
  return ab.length === bb.length && timingSafeEqual(ab, bb);
}

/**
 * Only a path on this site may be a post-sign-in destination (never `//evil.example`). It becomes
 * a Location header, which holds visible ASCII only: anything else (non-ASCII, spaces, CR, LF,
 * NUL) is percent-encoded, and a path that cannot be (a lone surrogate) is not used.
 */
export function safeNextPath(next: unknown): string {
  if (typeof next !== 'string' || !/^\/(?![/\\])/.test(next) || next.length > 2000) return '/dashboard';
  try {
    return next.replace(/[^\x21-\x7e]/gu, (c) => encodeURIComponent(c));
  } catch {
    return '/dashboard';
  }
}
