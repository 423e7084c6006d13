import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import type { BillingContext } from '../../src/ledger/billing.ts';
import { ApiError } from '../../src/http/errors.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Customer = { customer_id: string; connection_secret: string; wallet: { wallet_id: string } };
type Meter = { meter_id: string; meter_slug: string; product_secret: string };

const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64');

describe.each(databasesUnderTest())('resolveForwardCredential on %s', (dialect) => {
  let t: TestApp;
  let keyId: string;
  let customer: Customer;
  let meter: Meter;
  let other: Merchant;
  let otherCustomer: Customer;
  let otherMeter: Meter;

  const createCustomer = async (key: string): Promise<Customer> =>
    (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(key), payload: { name: 'Ada' } })).json();
  const createMeter = async (key: string, slug: string): Promise<Meter> => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/meters',
      headers: t.auth(key),
      payload: { name: 'Chat', meter_slug: slug, rate_type: 'fixed', tiers: [{ start: '0', rate: '1' }] },
    });
    expect(res.statusCode).toBe(201);
    return res.json();
  };
  const lava = (key = t.merchant.secretKey) => new Lava(key, { baseUrl: 'http://tollgate.test/v1/' });
  const resolve = (credential: string) => resolveForwardCredential(t.storage, credential, new Date());
  const rejection = async (credential: string): Promise<ApiError> => {
    const err = await resolve(credential).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ApiError);
    return err as ApiError;
  };

  beforeAll(async () => {
    t = await startTestApp(dialect);
    const keys = (await t.app.inject({ method: 'GET', url: '/v1/secret_keys', headers: t.auth() })).json();
    keyId = keys.data[0].secret_key_id;
    customer = await createCustomer(t.merchant.secretKey);
    meter = await createMeter(t.merchant.secretKey, 'chat');
    other = await t.newMerchant('Other');
    otherCustomer = await createCustomer(other.secretKey);
    otherMeter = await createMeter(other.secretKey, 'other-chat');
  });
  afterAll(async () => t?.close());

  const merchantPart = () => ({
    merchantId: t.merchant.merchantId,
    merchantWalletId: t.merchant.walletId,
    secretKeyId: keyId,
    serviceChargeRate: null,
  });

  it('a raw secret key: merchant mode, the merchant wallet pays', async () => {
    expect(await resolve(t.merchant.secretKey)).toEqual<BillingContext>({
      ...merchantPart(),
      mode: 'merchant',
      connection: null,
      meter: null,
      providerKey: null,
      providerKeyType: 'managed',
      payer: 'merchant',
    });
  });

  it('a token with secret_key only: merchant mode', async () => {
    expect(await resolve(lava().generateForwardToken({}))).toEqual<BillingContext>({
      ...merchantPart(),
      mode: 'merchant',
      connection: null,
      meter: null,
      providerKey: null,
      providerKeyType: 'managed',
      payer: 'merchant',
    });
  });

  it("a token with the caller's provider key and no customer or meter: unmanaged metering", async () => {
    const want = {
      ...merchantPart(),
      mode: 'unmanaged_metering',
      connection: null,
      meter: null,
      providerKey: 'sk-own-key',
      providerKeyType: 'unmanaged',
      payer: 'merchant',
    };
    expect(await resolve(lava().generateForwardToken({ customer_id: null, meter_slug: null, provider_key: 'sk-own-key' }))).toEqual(want);
    expect(await resolve(lava().generateForwardToken({ provider_key: 'sk-own-key' }))).toEqual(want);
    // The older client's metering-only shape.
    expect(
      await resolve(b64({ secret_key: t.merchant.secretKey, connection_secret: null, product_secret: null, provider_key: 'sk-own-key' })),
    ).toEqual(want);
  });

  it('meter only: usage attributed to the meter, the merchant pays', async () => {
    const ctx = await resolve(lava().generateForwardToken({ meter_slug: meter.meter_slug }));
    expect(ctx).toMatchObject({ ...merchantPart(), mode: 'meter_only', connection: null, payer: 'merchant', providerKeyType: 'managed' });
    expect(ctx.meter?.id).toBe(meter.meter_id);
    // The older vocabulary: product_secret alone.
    const older = await resolve(b64({ secret_key: t.merchant.secretKey, product_secret: meter.product_secret }));
    expect(older).toMatchObject({ mode: 'meter_only', connection: null, payer: 'merchant' });
    expect(older.meter?.id).toBe(meter.meter_id);
  });

  it("customer billing: the customer's wallet pays, in every vocabulary", async () => {
    const want = {
      ...merchantPart(),
      mode: 'customer',
      connection: { id: customer.customer_id, wallet_id: customer.wallet.wallet_id },
      providerKey: null,
      providerKeyType: 'managed',
      payer: 'customer',
    };
    const tokens = [
      lava().generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug }),
      lava().generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug, disable_billing: false }),
      b64({ secret_key: t.merchant.secretKey, connection_id: customer.customer_id, meter_slug: meter.meter_slug }),
      b64({ secret_key: t.merchant.secretKey, connection_secret: customer.connection_secret, product_secret: meter.product_secret }),
    ];
    for (const token of tokens) {
      const ctx = await resolve(token);
      expect(ctx).toMatchObject(want);
      expect(ctx.meter).toMatchObject({ id: meter.meter_id, merchant_id: t.merchant.merchantId, slug: meter.meter_slug });
    }
  });

  it("customer billing with the caller's provider key is unmanaged", async () => {
    const ctx = await resolve(
      b64({ secret_key: t.merchant.secretKey, connection_secret: customer.connection_secret, product_secret: meter.product_secret, provider_key: 'pk' }),
    );
    expect(ctx).toMatchObject({ mode: 'customer', payer: 'customer', providerKey: 'pk', providerKeyType: 'unmanaged' });
  });

  it('disable_billing: recorded for the customer and meter, the merchant pays', async () => {
    const ctx = await resolve(
      lava().generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug, disable_billing: true }),
    );
    expect(ctx).toMatchObject({
      ...merchantPart(),
      mode: 'billing_disabled',
      connection: { id: customer.customer_id, wallet_id: customer.wallet.wallet_id },
      payer: 'merchant',
    });
    expect(ctx.meter?.id).toBe(meter.meter_id);
  });

  it("another merchant's customer or meter is 401, in every vocabulary", async () => {
    const cases = [
      lava().generateForwardToken({ customer_id: otherCustomer.customer_id, meter_slug: meter.meter_slug }),
      lava().generateForwardToken({ customer_id: customer.customer_id, meter_slug: otherMeter.meter_slug }),
      lava().generateForwardToken({ meter_slug: otherMeter.meter_slug }),
      b64({ secret_key: t.merchant.secretKey, connection_secret: otherCustomer.connection_secret, product_secret: meter.product_secret }),
      b64({ secret_key: t.merchant.secretKey, connection_secret: customer.connection_secret, product_secret: otherMeter.product_secret }),
      b64({ secret_key: t.merchant.secretKey, product_secret: otherMeter.product_secret }),
    ];
    for (const token of cases) {
      const err = await rejection(token);
      expect(err.code).toBe('unauthorized');
      expect(err.status).toBe(401);
    }
    // The other merchant resolves its own objects with its own key.
    const own = await resolve(
      lava(other.secretKey).generateForwardToken({ customer_id: otherCustomer.customer_id, meter_slug: otherMeter.meter_slug }),
    );
    expect(own).toMatchObject({ merchantId: other.merchantId, merchantWalletId: other.walletId, mode: 'customer' });
  });

  it('an unknown or deleted customer, an unknown meter slug: 401', async () => {
    const gone = await createCustomer(t.merchant.secretKey);
    const del = await t.app.inject({ method: 'DELETE', url: `/v1/customers/${gone.customer_id}`, headers: t.auth() });
    expect(del.statusCode).toBe(200);
    for (const token of [
      lava().generateForwardToken({ customer_id: gone.customer_id, meter_slug: meter.meter_slug }),
      lava().generateForwardToken({ customer_id: 'con_01NOSUCHCUSTOMER', meter_slug: meter.meter_slug }),
      lava().generateForwardToken({ customer_id: customer.customer_id, meter_slug: 'no-such-meter' }),
      b64({ secret_key: t.merchant.secretKey, connection_secret: gone.connection_secret, product_secret: meter.product_secret }),
    ]) {
      expect((await rejection(token)).code).toBe('unauthorized');
    }
  });

  it('an unknown or revoked secret key is 401, raw or inside a token', async () => {
    const created = (
      await t.app.inject({ method: 'POST', url: '/v1/secret_keys', headers: t.auth(), payload: { name: 'temp' } })
    ).json();
    const token = lava(created.secret_key).generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug });
    expect(await resolve(created.secret_key)).toMatchObject({ mode: 'merchant', secretKeyId: created.secret_key_id });
    expect(await resolve(token)).toMatchObject({ mode: 'customer', secretKeyId: created.secret_key_id });

    const revoked = await t.app.inject({ method: 'DELETE', url: `/v1/secret_keys/${created.secret_key_id}`, headers: t.auth() });
    expect(revoked.statusCode).toBe(200);
    for (const credential of [created.secret_key, token, 'sk_live_unknown', lava('sk_live_unknown').generateForwardToken({})]) {
      const err = await rejection(credential);
      expect(err.code).toBe('unauthorized');
      expect(err.status).toBe(401);
    }
  });

  it('a malformed token is 400 before any lookup', async () => {
    expect((await rejection('%%%')).code).toBe('forward_token_json_invalid');
    expect((await rejection(b64({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id }))).code).toBe(
      'forward_token_invalid',
    );
  });
});
