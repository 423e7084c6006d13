import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Customer = {
  customer_id: string;
  connection_id: string;
  connection_secret: string;
  reference_id: string | null;
  contact: { phone: string | null; email: string | null; first_name: string | null; last_name: string | null };
  wallet: {
    wallet_id: string;
    balance: string;
    phone: string | null;
    email: string | null;
    first_name: string | null;
    last_name: string | null;
  };
  subscription: null;
  metadata: Record<string, string> | null;
  next_usage_reset: string;
  previous_usage_reset: string;
  created_at: string;
};
type Page = { data: Customer[]; has_more: boolean; next_cursor: string | null };
type ErrorBody = {
  error: { message: string; code: string; status: number; issues?: { path: string[]; message: string }[] };
};

const issuePaths = (body: ErrorBody) => (body.error.issues ?? []).map((i) => i.path);

/**
 * Ids are ULIDs that sort by creation time only to the millisecond (src/domain/ids.ts uses the
 * non-monotonic `ulid()`), so tests asserting "newest first" create each item in a fresh millisecond.
 */
async function nextMillisecond(): Promise<void> {
  const start = Date.now();
  // Wall clock: ids take their millisecond from the system clock, not the app's.
  while (Date.now() === start) await new Promise((r) => setTimeout(r, 1));
}

describe.each(databasesUnderTest())('customers on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const create = (body: unknown, key?: string) =>
    t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(key), payload: body as object });
  const createOk = async (body: unknown, key?: string): Promise<Customer> => {
    await nextMillisecond();
    const res = await create(body, key);
    expect(res.statusCode).toBe(201);
    return res.json<Customer>();
  };
  const get = (url: string, key?: string) => t.app.inject({ method: 'GET', url, headers: t.auth(key) });
  const patch = (id: string, body: unknown, key?: string) =>
    t.app.inject({ method: 'PATCH', url: `/v1/customers/${id}`, headers: t.auth(key), payload: body as object });
  const del = (url: string, key?: string) => t.app.inject({ method: 'DELETE', url, headers: t.auth(key) });

  it('creates a customer: name split into first/last, contact and wallet blocks, older aliases, empty wallet', async () => {
    const res = await create({
      name: 'Ada King Lovelace',
      email: 'ada@example.com',
      phone: '+44 20 7946 0000',
      reference_id: 'user-1',
      metadata: { plan: 'pro', team_id: 't_42' },
    });
    expect(res.statusCode).toBe(201);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    const c = res.json<Customer>();
    const contact = { phone: '+44 20 7946 0000', email: 'ada@example.com', first_name: 'Ada', last_name: 'King Lovelace' };
    expect(c).toMatchObject({
      reference_id: 'user-1',
      contact,
      wallet: { ...contact, balance: '0.0000000000' },
      subscription: null,
      metadata: { plan: 'pro', team_id: 't_42' },
    });
    expect(c.customer_id).toMatch(/^con_[0-9A-Z]{26}$/);
    expect(c.connection_id).toBe(c.customer_id);
    expect(c.connection_secret).toMatch(/^cons_.{16,}$/);
    expect(c.wallet.wallet_id).toMatch(/^wal_/);
    expect(c.wallet.wallet_id).not.toBe(t.merchant.walletId);
    expect(Number.isNaN(Date.parse(c.created_at))).toBe(false);
    expect(Date.parse(c.previous_usage_reset)).toBeLessThanOrEqual(Date.parse(c.created_at));
    expect(Date.parse(c.next_usage_reset)).toBeGreaterThan(Date.parse(c.created_at));
  });

  it('creates a customer from an empty body with every optional field null', async () => {
    const c = await createOk({});
    expect(c).toMatchObject({
      reference_id: null,
      contact: { phone: null, email: null, first_name: null, last_name: null },
      metadata: null,
      wallet: { balance: '0.0000000000' },
    });
  });

  it('accepts a JSON content type with no body at all on create', async () => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/customers',
      headers: { ...t.auth(), 'content-type': 'application/json' },
    });
    expect(res.statusCode).toBe(201);
    expect(res.json<Customer>().customer_id).toMatch(/^con_/);
  });

  it('puts a one-word name into first_name and leaves last_name null', async () => {
    const c = await createOk({ name: '  Cher  ' });
    expect(c.contact).toMatchObject({ first_name: 'Cher', last_name: null });
  });

  it('gives each customer a distinct connection secret', async () => {
    const a = await createOk({});
    const b = await createOk({});
    expect(a.connection_secret).not.toBe(b.connection_secret);
    expect(a.customer_id).not.toBe(b.customer_id);
  });

  it('patches only the fields sent, and null clears a field', async () => {
    const c = await createOk({ name: 'Grace Hopper', email: 'grace@example.com', phone: '123', metadata: { a: 'b' } });
    const renamed = await patch(c.customer_id, { name: 'Grace Brewster Hopper' });
    expect(renamed.statusCode).toBe(200);
    expect(renamed.json<Customer>()).toMatchObject({
      contact: { first_name: 'Grace', last_name: 'Brewster Hopper', email: 'grace@example.com', phone: '123' },
      metadata: { a: 'b' },
      connection_secret: c.connection_secret,
      created_at: c.created_at,
    });

    const cleared = await patch(c.customer_id, { email: null, phone: null, metadata: null, reference_id: null });
    expect(cleared.statusCode).toBe(200);
    expect(cleared.json<Customer>()).toMatchObject({
      contact: { first_name: 'Grace', last_name: 'Brewster Hopper', email: null, phone: null },
      wallet: { email: null, phone: null, first_name: 'Grace' },
      metadata: null,
      reference_id: null,
    });

    const nameless = await patch(c.customer_id, { name: null });
    expect(nameless.json<Customer>().contact).toMatchObject({ first_name: null, last_name: null });

    const firstLast = await patch(c.customer_id, { first_name: 'G', last_name: 'H', metadata: { x: 'y' } });
    expect(firstLast.json<Customer>()).toMatchObject({ contact: { first_name: 'G', last_name: 'H' }, metadata: { x: 'y' } });

    const retrieved = await get(`/v1/customers/${c.customer_id}`);
    expect(retrieved.json()).toEqual(firstLast.json());
  });

  it('treats an empty patch as a no-op that returns the customer', async () => {
    const c = await createOk({ name: 'No Op', reference_id: 'noop-1' });
    const res = await patch(c.customer_id, {});
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual(c);
    const bodiless = await t.app.inject({
      method: 'PATCH',
      url: `/v1/customers/${c.customer_id}`,
      headers: { ...t.auth(), 'content-type': 'application/json' },
    });
    expect(bodiless.statusCode).toBe(200);
    expect(bodiless.json()).toEqual(c);
  });

  it('refuses malformed JSON on PATCH with invalid_json, leaving the customer unchanged', async () => {
    const c = await createOk({ name: 'Grace Hopper' });
    const res = await t.app.inject({
      method: 'PATCH',
      url: `/v1/customers/${c.customer_id}`,
      headers: { ...t.auth(), 'content-type': 'application/json' },
      payload: '{"name": "Someone Else"',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json<ErrorBody>()).toEqual({ error: { message: expect.any(String), code: 'invalid_json', status: 400 } });
    const after = (await get(`/v1/customers/${c.customer_id}`)).json<Customer>();
    expect(after).toEqual(c);
  });

  it('rejects an invalid email with a validation error on ["email"]', async () => {
    const res = await create({ email: 'not-an-email' });
    expect(res.statusCode).toBe(400);
    const body = res.json<ErrorBody>();
    expect(body.error.code).toBe('validation_error');
    expect(issuePaths(body)).toContainEqual(['email']);
  });

  describe('metadata validation', () => {
    const tooMany = Object.fromEntries(Array.from({ length: 101 }, (_, i) => [`k${i}`, 'v']));
    const exactlyMax = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`k${i}`, 'v']));

    it.each([
      ['more than 100 pairs', tooMany, ['metadata']],
      ['a key with a dash', { 'bad-key': 'v' }, ['metadata', 'bad-key']],
      ['a 256-character value', { long: 'x'.repeat(256) }, ['metadata', 'long']],
      ['a 256-character key', { ['k'.repeat(256)]: 'v' }, ['metadata', 'k'.repeat(256)]],
      ['a non-string value', { count: 3 }, ['metadata', 'count']],
      ['an empty value', { empty: '' }, ['metadata', 'empty']],
      ['a non-object', 'plan=pro', ['metadata']],
    ])('rejects %s on create and patch with a 400 naming the metadata path', async (_label, metadata, path) => {
      const created = await create({ metadata });
      expect(created.statusCode).toBe(400);
      const body = created.json<ErrorBody>();
      expect(body.error).toMatchObject({ code: 'validation_error', status: 400 });
      expect(issuePaths(body)).toContainEqual(path);

      const c = await createOk({});
      const patched = await patch(c.customer_id, { metadata });
      expect(patched.statusCode).toBe(400);
      expect(issuePaths(patched.json<ErrorBody>())).toContainEqual(path);
    });

    it('accepts exactly 100 pairs, 255-character values and underscore/digit keys', async () => {
      const c = await createOk({ metadata: exactlyMax });
      expect(Object.keys(c.metadata ?? {})).toHaveLength(100);
      const edge = await createOk({ metadata: { Key_9: 'v'.repeat(255), ['k'.repeat(255)]: 'x' } });
      expect(edge.metadata).toEqual({ Key_9: 'v'.repeat(255), ['k'.repeat(255)]: 'x' });
    });
  });

  describe('reference_id', () => {
    it('is unique per merchant: a second create answers the holder unchanged (200), a patch onto a taken one is 409 reference_id_taken', async () => {
      const a = await createOk({ reference_id: 'dup-ref' });
      const again = await create({ reference_id: 'dup-ref', name: 'Not Applied', email: 'other@example.com' });
      expect(again.statusCode).toBe(200);
      expect(again.json<Customer>()).toEqual(a);

      const b = await createOk({ reference_id: 'other-ref' });
      const moved = await patch(b.customer_id, { reference_id: 'dup-ref' });
      expect(moved.statusCode).toBe(409);
      expect(moved.json<ErrorBody>().error.code).toBe('reference_id_taken');
      // Nothing was changed by the refused patch.
      expect((await get(`/v1/customers/${b.customer_id}`)).json<Customer>().reference_id).toBe('other-ref');

      // Re-sending a customer's own reference_id is not a conflict.
      const same = await patch(a.customer_id, { reference_id: 'dup-ref' });
      expect(same.statusCode).toBe(200);
    });

    it('may be reused by another merchant, and again after the holder is deleted', async () => {
      const mine = await createOk({ reference_id: 'shared-ref' });
      const other = await t.newMerchant();
      const theirs = await create({ reference_id: 'shared-ref' }, other.secretKey);
      expect(theirs.statusCode).toBe(201);

      expect((await del(`/v1/customers/${mine.customer_id}`)).statusCode).toBe(200);
      const reused = await create({ reference_id: 'shared-ref' });
      expect(reused.statusCode).toBe(201);
    });

    it('filters the list', async () => {
      const m = await t.newMerchant();
      const wanted = await createOk({ reference_id: 'find-me' }, m.secretKey);
      await createOk({ reference_id: 'not-me' }, m.secretKey);
      await createOk({}, m.secretKey);
      const res = await get('/v1/customers?reference_id=find-me', m.secretKey);
      expect(res.statusCode).toBe(200);
      expect(res.json<Page>()).toEqual({ data: [wanted], has_more: false, next_cursor: null });
      const none = await get('/v1/customers?reference_id=nobody', m.secretKey);
      expect(none.json<Page>().data).toEqual([]);
    });
  });

  describe('older /v1/connections vocabulary', () => {
    it('lists and retrieves the same objects as /v1/customers', async () => {
      const m = await t.newMerchant();
      const a = await createOk({ name: 'Conn One', reference_id: 'c1' }, m.secretKey);
      const b = await createOk({ name: 'Conn Two' }, m.secretKey);

      const customers = (await get('/v1/customers', m.secretKey)).json<Page>();
      const connections = await get('/v1/connections', m.secretKey);
      expect(connections.statusCode).toBe(200);
      expect(connections.json<Page>()).toEqual(customers);
      expect(customers.data.map((c) => c.customer_id)).toEqual([b.customer_id, a.customer_id]);

      const one = await get(`/v1/connections/${a.customer_id}`, m.secretKey);
      expect(one.statusCode).toBe(200);
      expect(one.json()).toEqual(a);

      const byRef = await get('/v1/connections?reference_id=c1', m.secretKey);
      expect(byRef.json<Page>().data).toEqual([a]);
    });

    it('deletes through /v1/connections with {success:true}, after which neither path finds it', async () => {
      const c = await createOk({});
      const res = await del(`/v1/connections/${c.customer_id}`);
      expect(res.statusCode).toBe(200);
      expect(res.json()).toEqual({ success: true });
      expect((await get(`/v1/customers/${c.customer_id}`)).statusCode).toBe(404);
      const again = await get(`/v1/connections/${c.customer_id}`);
      expect(again.statusCode).toBe(404);
      expect(again.json<ErrorBody>().error.code).toBe('not_found');
    });
  });

  describe('tenant isolation', () => {
    let other: Merchant;
    let mine: Customer;
    beforeAll(async () => {
      other = await t.newMerchant('Other');
      mine = await createOk({ name: 'Private Person', reference_id: 'private' });
    });

    it("answers 404 for another merchant's customer on every verb and path", async () => {
      for (const url of [`/v1/customers/${mine.customer_id}`, `/v1/connections/${mine.customer_id}`]) {
        const got = await get(url, other.secretKey);
        expect(got.statusCode).toBe(404);
        expect(got.json<ErrorBody>().error.code).toBe('not_found');
        expect((await del(url, other.secretKey)).statusCode).toBe(404);
      }
      const patched = await patch(mine.customer_id, { name: 'Hijacked' }, other.secretKey);
      expect(patched.statusCode).toBe(404);
      // The owner still sees it unchanged.
      const still = await get(`/v1/customers/${mine.customer_id}`);
      expect(still.statusCode).toBe(200);
      expect(still.json<Customer>().contact.first_name).toBe('Private');
    });

    it("never lists another merchant's customers, nor accepts one as a cursor", async () => {
      const list = await get('/v1/customers', other.secretKey);
      expect(list.json<Page>().data.map((c) => c.customer_id)).not.toContain(mine.customer_id);
      const byRef = await get('/v1/customers?reference_id=private', other.secretKey);
      expect(byRef.json<Page>().data).toEqual([]);
      const cursor = await get(`/v1/customers?cursor=${mine.customer_id}`, other.secretKey);
      expect(cursor.statusCode).toBe(400);
      expect(cursor.json<ErrorBody>().error.code).toBe('invalid_cursor');
    });
  });

  describe('pagination', () => {
    it.each(['0', '101', '-1', '2.5', 'ten'])('rejects limit=%s with validation_error on ["limit"]', async (limit) => {
      for (const base of ['/v1/customers', '/v1/connections']) {
        const res = await get(`${base}?limit=${limit}`);
        expect(res.statusCode).toBe(400);
        const body = res.json<ErrorBody>();
        expect(body.error).toMatchObject({ code: 'validation_error', status: 400 });
        expect(issuePaths(body)).toContainEqual(['limit']);
      }
    });

    it.each(['/v1/customers', '/v1/connections'])('rejects an unknown cursor on %s with 400 invalid_cursor', async (base) => {
      const res = await get(`${base}?cursor=con_01ARZ3NDEKTSV4RRFFQ69G5FAV`);
      expect(res.statusCode).toBe(400);
      expect(res.json<ErrorBody>().error).toMatchObject({ code: 'invalid_cursor', status: 400 });
    });

    it("rejects another merchant's customer as a cursor on /v1/connections", async () => {
      const other = await t.newMerchant();
      const theirs = await createOk({}, other.secretKey);
      const res = await get(`/v1/connections?cursor=${theirs.customer_id}`);
      expect(res.statusCode).toBe(400);
      expect(res.json<ErrorBody>().error).toMatchObject({ code: 'invalid_cursor', status: 400 });
    });

    it('pages newest first with limit and next_cursor, default page size 10', async () => {
      const m = await t.newMerchant();
      const ids: string[] = [];
      for (let i = 0; i < 12; i++) ids.push((await createOk({ name: `P ${i}` }, m.secretKey)).customer_id);
      const newestFirst = [...ids].reverse();

      const first = (await get('/v1/customers', m.secretKey)).json<Page>();
      expect(first.data.map((c) => c.customer_id)).toEqual(newestFirst.slice(0, 10));
      expect(first.has_more).toBe(true);
      expect(first.next_cursor).toBe(newestFirst[9]);

      const seen: string[] = [];
      let cursor: string | null = null;
      do {
        const qs: string = cursor ? `?limit=5&cursor=${cursor}` : '?limit=5';
        const page: Page = (await get(`/v1/customers${qs}`, m.secretKey)).json<Page>();
        expect(page.data.length).toBeLessThanOrEqual(5);
        seen.push(...page.data.map((c) => c.customer_id));
        cursor = page.next_cursor;
        expect(page.has_more).toBe(cursor !== null);
      } while (cursor);
      expect(seen).toEqual(newestFirst);
    });

    it('skips deleted customers in lists but still accepts a deleted one as a cursor', async () => {
      const m = await t.newMerchant();
      const a = await createOk({}, m.secretKey);
      const b = await createOk({}, m.secretKey);
      const c = await createOk({}, m.secretKey);
      await del(`/v1/customers/${b.customer_id}`, m.secretKey);
      const all = (await get('/v1/customers', m.secretKey)).json<Page>();
      expect(all.data.map((x) => x.customer_id)).toEqual([c.customer_id, a.customer_id]);
      const after = await get(`/v1/customers?cursor=${b.customer_id}`, m.secretKey);
      expect(after.statusCode).toBe(200);
      expect(after.json<Page>().data.map((x) => x.customer_id)).toEqual([a.customer_id]);
    });
  });

  it('deletes with {success:true}; retrieve, patch and a second delete then answer 404', async () => {
    const c = await createOk({ name: 'Short Lived', email: 'short.lived@example.com', phone: '+15550100999', metadata: { plan: 'pro' } });
    const url = `/v1/customers/${c.customer_id}`;
    const res = await del(url);
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    expect(res.json()).toEqual({ success: true });

    const gone = await get(url);
    expect(gone.statusCode).toBe(404);
    expect(gone.json<ErrorBody>().error).toMatchObject({ code: 'not_found', status: 404 });
    expect((await patch(c.customer_id, { name: 'Back' })).statusCode).toBe(404);
    expect((await del(url)).statusCode).toBe(404);

    // What identifies it for the ledger stays; its contact details and metadata are erased.
    const stored = await t.storage.db.selectFrom('connections').selectAll().where('id', '=', c.customer_id).executeTakeFirstOrThrow();
    expect(stored).toMatchObject({ first_name: null, last_name: null, email: null, phone: null, metadata: null, wallet_id: c.wallet.wallet_id });
    expect(stored.deleted_at).toEqual(expect.any(String));
  });

  it('requires a secret key', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/v1/customers' });
    expect(res.statusCode).toBe(401);
    expect(res.json<ErrorBody>().error.code).toBe('unauthorized');
  });
});
