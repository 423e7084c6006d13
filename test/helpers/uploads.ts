import { request } from 'node:http';

const DECLARED_BYTES = 10 * 1024 * 1024;
const FIRST_BYTES = Buffer.alloc(1024, 'a');
const ANSWER_WAIT_MS = 5_000;

/**
 * Declares a 10 MiB upload, sends its first KiB and no more, and waits for the answer. Only a
 * server that answers without reading the body answers at all: one that reads first is still
 * waiting for the rest when ANSWER_WAIT_MS runs out, and this rejects.
 */
export async function refusedBeforeUpload(
  url: string,
  headers: Record<string, string> = {},
  opts: { contentType?: string } = {},
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    let answered = false;
    const req = request(url, {
      method: 'POST',
      headers: { 'content-type': opts.contentType ?? 'application/json', 'content-length': String(DECLARED_BYTES), ...headers },
    });
    const timer = setTimeout(() => {
      req.destroy();
      reject(new Error(`no answer from ${url} within ${ANSWER_WAIT_MS} ms of sending 1 KiB of a declared 10 MiB body: it waits for the body`));
    }, ANSWER_WAIT_MS);
    req.on('response', (res) => {
      answered = true;
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(parts).toString('utf8') });
        req.destroy();
      });
    });
    // Once answered, the server may close the connection on the unread body: that is the point.
    req.on('error', (e) => {
      if (answered) return;
      clearTimeout(timer);
      reject(e);
    });
    req.write(FIRST_BYTES);
  });
}
