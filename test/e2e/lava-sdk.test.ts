import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

/**
 * The published client (`@lavapayments/nodejs` 11.2) against a real server over loopback HTTP.
 * It sends `Content-Type: application/json` on every call (GET, DELETE and body-less POST included),
 * returns `response.json()` as is, and reports errors only as
 * `Lava API Error: <status> <statusText> - <JSON of the error member>`.
 */
describe.each(databasesUnderTest())('published Lava client (11.2) against the server on %s', (dialect) => {
  let t: TestApp;
  let base: string;
  const client = (key: string) => new Lava(key, { baseUrl: `${base}/v1/` });

  beforeAll(async () => {
    t = await startTestApp(dialect);
    base = await t.listen();
  });
  afterAll(async () => t?.close());
  checkResponsesAgainstOpenApi(() => t);

  describe('meters', () => {
    it('creates, lists, retrieves, updates and deletes a meter', async () => {
      const m = await t.newMerchant();
      const lava = client(m.secretKey);

      const created = await lava.meters.create({
        name: 'SDK tokens',
        rate_type: 'fixed',
        tier_type: 'tokens_1m',
        tiers: [
          { start: '0', rate: '3' },
          { start: '1000000', rate: '1.5' },
        ],
      });
      expect(created).toMatchObject({
        name: 'SDK tokens',
        meter_slug: 'sdk-tokens',
        rate_type: 'fixed',
        tiers: [
          { start: 0, rate: '3.0000000000', type: 'tokens_1m' },
          { start: 1_000_000, rate: '1.5000000000', type: 'tokens_1m' },
        ],
      });
      expect(created.meter_id).toMatch(/^met_/);
      expect(typeof created.tiers[0]?.start).toBe('number');
      const explicit = await lava.meters.create({
        name: 'Per request',
        meter_slug: 'per-req',
        rate_type: 'percentage',
        tier_type: 'requests',
        tiers: [{ start: '0', rate: '10' }],
      });
      expect(explicit).toMatchObject({ meter_slug: 'per-req', rate_type: 'percentage', tiers: [{ type: 'requests' }] });

      const list = await lava.meters.list();
      expect(list.data.map((x) => x.meter_id)).toEqual([explicit.meter_id, created.meter_id]);
      expect(list.has_more).toBe(false);

      const paged = await lava.meters.list({ limit: 1 });
      expect(paged.data.map((x) => x.meter_id)).toEqual([explicit.meter_id]);
      expect(paged.has_more).toBe(true);
      const rest = await lava.meters.list({ limit: 1, cursor: paged.next_cursor ?? undefined });
      expect(rest.data.map((x) => x.meter_id)).toEqual([created.meter_id]);

      expect(await lava.meters.retrieve(created.meter_id)).toEqual(created);

      const updated = await lava.meters.update(created.meter_id, {
        name: 'SDK tokens v2',
        tiers: [{ start: '0', rate: '0.25' }],
      });
      expect(updated).toMatchObject({
        meter_id: created.meter_id,
        meter_slug: 'sdk-tokens',
        name: 'SDK tokens v2',
        tiers: [{ start: 0, rate: '0.2500000000', type: 'tokens_1m' }],
      });

      const deleted = await lava.meters.delete(created.meter_id);
      expect(deleted).toEqual({ id: created.meter_id, deleted: true });
      await expect(lava.meters.retrieve(created.meter_id)).rejects.toThrow(/^Lava API Error: 404 .*"code":"not_found"/);
      expect((await lava.meters.list()).data.map((x) => x.meter_id)).toEqual([explicit.meter_id]);
    });

    it('surfaces a validation failure as a 400 with our code and the field path', async () => {
      const lava = client(t.merchant.secretKey);
      const err = await lava.meters
        .create({ name: 'Bad', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '5', rate: '1' }] })
        .then(
          () => null,
          (e: unknown) => e as Error,
        );
      expect(err?.message).toMatch(/^Lava API Error: 400 Bad Request - /);
      expect(err?.message).toContain('"code":"validation_error"');
      expect(err?.message).toContain('"path":["tiers","0","start"]');
    });
  });

  describe('customers', () => {
    it('creates a customer with name, email, phone, reference_id and metadata', async () => {
      const lava = client(t.merchant.secretKey);
      const c = await lava.customers.create({
        name: 'Ada Lovelace',
        email: 'ada@example.com',
        phone: '+15550100',
        reference_id: 'sdk-user-1',
        metadata: { plan: 'pro' },
      });
      expect(c).toMatchObject({
        reference_id: 'sdk-user-1',
        contact: { first_name: 'Ada', last_name: 'Lovelace', email: 'ada@example.com', phone: '+15550100' },
        subscription: null,
        metadata: { plan: 'pro' },
      });
      expect(c.customer_id).toMatch(/^con_/);
      expect(Number.isNaN(Date.parse(c.created_at))).toBe(false);

      expect(await lava.customers.retrieve(c.customer_id)).toEqual(c);
    });

    it('creates a customer from no fields at all', async () => {
      const lava = client(t.merchant.secretKey);
      const c = await lava.customers.create({});
      expect(c).toMatchObject({
        reference_id: null,
        contact: { first_name: null, last_name: null, email: null, phone: null },
        metadata: null,
      });
    });

    it('pages through customers with cursor and limit', async () => {
      const m = await t.newMerchant();
      const lava = client(m.secretKey);
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) {
        ids.push((await lava.customers.create({ name: `Page ${i}` })).customer_id);
      }

      const all = await lava.customers.list();
      expect(all.data.map((c) => c.customer_id)).toEqual([...ids].reverse());
      expect(all.has_more).toBe(false);

      const seen: string[] = [];
      let cursor: string | undefined;
      let pages = 0;
      do {
        const page = await lava.customers.list({ limit: 2, ...(cursor ? { cursor } : {}) });
        expect(page.data.length).toBeLessThanOrEqual(2);
        seen.push(...page.data.map((c) => c.customer_id));
        cursor = page.next_cursor ?? undefined;
        expect(page.has_more).toBe(cursor !== undefined);
        pages++;
      } while (cursor);
      expect(pages).toBe(3);
      expect(seen).toEqual([...ids].reverse());
    });

    it('updates fields, clears them with null, and deletes with {success:true}', async () => {
      const lava = client(t.merchant.secretKey);
      const c = await lava.customers.create({ name: 'Grace Hopper', email: 'grace@example.com', reference_id: 'sdk-upd' });

      const updated = await lava.customers.update(c.customer_id, {
        name: 'Grace Brewster Hopper',
        phone: '+15550101',
        metadata: { tier: 'gold' },
      });
      expect(updated).toMatchObject({
        customer_id: c.customer_id,
        reference_id: 'sdk-upd',
        contact: { first_name: 'Grace', last_name: 'Brewster Hopper', email: 'grace@example.com', phone: '+15550101' },
        metadata: { tier: 'gold' },
      });

      const cleared = await lava.customers.update(c.customer_id, { email: null, reference_id: null, metadata: null });
      expect(cleared).toMatchObject({ reference_id: null, metadata: null, contact: { email: null, phone: '+15550101' } });
      expect(await lava.customers.retrieve(c.customer_id)).toEqual(cleared);

      expect(await lava.customers.delete(c.customer_id)).toEqual({ success: true });
      await expect(lava.customers.retrieve(c.customer_id)).rejects.toThrow(/^Lava API Error: 404 .*"code":"not_found"/);
      await expect(lava.customers.delete(c.customer_id)).rejects.toThrow(/^Lava API Error: 404 /);
    });

    it('answers a create with a taken reference_id with that customer; refuses taking it by update, and bad metadata, with our codes', async () => {
      const lava = client(t.merchant.secretKey);
      const first = await lava.customers.create({ reference_id: 'sdk-dup' });
      expect(await lava.customers.create({ reference_id: 'sdk-dup', name: 'Someone Else' })).toEqual(first);
      const other = await lava.customers.create({});
      await expect(lava.customers.update(other.customer_id, { reference_id: 'sdk-dup' })).rejects.toThrow(
        /^Lava API Error: 409 Conflict - .*"code":"reference_id_taken"/,
      );
      await expect(lava.customers.create({ metadata: { 'bad-key': 'v' } })).rejects.toThrow(
        /^Lava API Error: 400 .*"code":"validation_error".*"path":\["metadata","bad-key"\]/,
      );
    });

    it("cannot see another merchant's customer", async () => {
      const mine = await client(t.merchant.secretKey).customers.create({ name: 'Mine Only' });
      const other = await t.newMerchant();
      await expect(client(other.secretKey).customers.retrieve(mine.customer_id)).rejects.toThrow(/^Lava API Error: 404 /);
      expect((await client(other.secretKey).customers.list()).data).toEqual([]);
    });
  });

  describe('secret keys', () => {
    it('creates, lists and deletes keys; deleting the last key fails with last_secret_key', async () => {
      const m = await t.newMerchant();
      const lava = client(m.secretKey);
      const [original] = (await lava.secretKeys.list()).data;
      expect(original).toBeDefined();
      const created = await lava.secretKeys.create({ name: 'SDK key' });
      expect(created.secret_key).toMatch(/^sk_live_/);
      expect(created.name).toBe('SDK key');

      const listed = await lava.secretKeys.list();
      expect(listed.data.map((k) => k.secret_key_id)).toEqual([created.secret_key_id, original!.secret_key_id]);
      expect(JSON.stringify(listed)).not.toContain(created.secret_key);

      // The new key works through the client too.
      const viaNew = client(created.secret_key);
      expect((await viaNew.secretKeys.list()).data).toHaveLength(2);

      // Delete the second key: works, returns {id, deleted:true}, and the key stops working.
      const third = await lava.secretKeys.create({ name: 'Disposable' });
      expect(await lava.secretKeys.delete(third.secret_key_id)).toEqual({ id: third.secret_key_id, deleted: true });
      await expect(client(third.secret_key).secretKeys.list()).rejects.toThrow(/^Lava API Error: 401 /);

      // Remove the original with the new key, then the new key is the last one.
      expect(await viaNew.secretKeys.delete(original!.secret_key_id)).toEqual({
        id: original!.secret_key_id,
        deleted: true,
      });
      await expect(lava.meters.list()).rejects.toThrow(/^Lava API Error: 401 /);
      const last = await viaNew.secretKeys.delete(created.secret_key_id).then(
        () => null,
        (e: unknown) => e as Error,
      );
      expect(last?.message).toMatch(/^Lava API Error: 409 Conflict - /);
      expect(last?.message).toContain('last_secret_key');
      expect((await viaNew.secretKeys.list()).data.map((k) => k.secret_key_id)).toEqual([created.secret_key_id]);
    });
  });

  describe('authentication errors', () => {
    it('surfaces a wrong key as "Lava API Error: 401" carrying our envelope and code', async () => {
      const lava = client('sk_live_thisKeyDoesNotExist0000000000');
      const err = await lava.customers.list().then(
        () => null,
        (e: unknown) => e as Error,
      );
      expect(err).toBeInstanceOf(Error);
      expect(err?.message).toMatch(/^Lava API Error: 401 Unauthorized - \{/);
      const json = err!.message.replace(/^Lava API Error: 401 Unauthorized - /, '');
      expect(JSON.parse(json)).toEqual({ message: expect.any(String), code: 'unauthorized', status: 401 });
    });

    it.each([
      ['meters.list', (l: Lava) => l.meters.list()],
      ['meters.retrieve', (l: Lava) => l.meters.retrieve('met_x')],
      ['customers.create', (l: Lava) => l.customers.create({ name: 'X' })],
      ['secretKeys.create', (l: Lava) => l.secretKeys.create({ name: 'X' })],
      ['secretKeys.delete', (l: Lava) => l.secretKeys.delete('sk_x')],
    ])('rejects %s with a wrong key as a 401 carrying our unauthorized code', async (_name, call) => {
      await expect(call(client('sk_live_wrong'))).rejects.toThrow(/^Lava API Error: 401 .*"code":"unauthorized"/);
    });
  });
});
