import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, type MockGateway } from '../helpers/gateway.ts';

/**
 * Forward, drop-in and rewrite endpoints authenticate before they read a body (decision 0019): a
 * caller announcing a 10 MiB body without a valid credential is answered 401 after the first
 * kilobyte, instead of the server buffering the whole body first. The answer arriving while the
 * client is still holding back the rest of its body is the proof.
 */

const ANNOUNCED = 10 * 1024 * 1024 - 1;

type Answer = { status: number; body: { error?: { code: string | number; details?: { reason: string }[] } } };

/** The interface's code: `code`, or in Google's dialect (whose `code` is the HTTP status) its ErrorInfo reason. */
const interfaceCode = (answer: Answer) => (typeof answer.body.error?.code === 'number' ? answer.body.error.details?.[0]?.reason : answer.body.error?.code);

/** Sends headers announcing ANNOUNCED bytes and only 1 KiB of body; resolves with the answer. */
function answerBeforeBodyEnds(base: string, path: string, headers: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': String(ANNOUNCED), ...headers },
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        req.destroy();
        resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) });
      });
    });
    req.on('error', (e) => reject(e));
    // A server that waits for the whole body never answers: give up (and free the socket) instead.
    const bound = setTimeout(() => {
      req.destroy();
      reject(new Error('no answer while the body was incomplete: the server waited for the body'));
    }, 5_000);
    req.on('close', () => clearTimeout(bound));
    // The rest of the body is never sent: only an answer given before reading it can arrive.
    req.write(Buffer.alloc(1024, 0x20));
  });
}

describe.each(databasesUnderTest())('credentials before the body on %s', (dialect) => {
  let gw: MockGateway;

  beforeAll(async () => {
    gw = await startGatewayOnMock(dialect, { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed' } });
  });
  afterAll(async () => {
    await gw.t.close();
    await gw.upstream.close();
  });

  const forwardPath = `/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;

  it.each([
    ['forward without a credential', forwardPath, {}],
    ['forward with an unknown secret key', forwardPath, { authorization: 'Bearer sk_live_unknownunknownunknown' }],
    ['drop-in chat without a key', '/v1/chat/completions', {}],
    ['drop-in messages with an unknown key', '/v1/messages', { 'x-api-key': 'sk_live_unknownunknownunknown' }],
    ['native Gemini drop-in without a key', '/v1beta/models/gemini-2.0-flash:generateContent', {}],
    ['native Gemini drop-in with an unknown ?key=', '/v1/models/gemini-2.0-flash:streamGenerateContent?alt=sse&key=sk_live_unknownunknownunknown', {}],
    ['rewrite without a credential', '/v1/rewrite/anthropic/https://api.openai.com/v1/messages', {}],
    ['rewrite with an unknown key', '/v1/rewrite/openai/https://api.anthropic.com/v1/chat/completions', { authorization: 'Bearer sk_live_unknownunknownunknown' }],
  ])('%s is refused with 401 before its body is read', async (_name, path, headers) => {
    const answer = await answerBeforeBodyEnds(gw.base, path, headers);
    expect(answer.status).toBe(401);
    expect(interfaceCode(answer)).toBe('unauthorized');
    expect(gw.upstream.requests).toHaveLength(0);
  });
});
