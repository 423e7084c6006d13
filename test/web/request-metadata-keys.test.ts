import { describe, expect, it } from 'vitest';
import { metadataKeysOf } from '../../src/storage/request-metadata-keys.ts';
import { useTestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/** The CSV export's metadata columns: the keys of the records the filters match, on both engines. */
describe.each(databasesUnderTest())('metadata keys of the export on %s', (dialect) => {
  const t = useTestApp(dialect);

  it('lists each key once, in order, only from the matching records', async () => {
    const c = await t.customerWithMeter({ credit: '5' });
    const record = async (id: string, metadata: Record<string, string>) => {
      const res = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: t.auth(), payload: { request_id: id, customer_id: c.customerId, meter_slug: c.meterSlug, input_tokens: 1, metadata } });
      expect(res.statusCode, res.body).toBe(201);
    };
    await record('k1', { team: 'search', env: 'prod' });
    await record('k2', { team: 'ads', region: 'eu' });
    await record('k3', {});
    const merchantId = t.merchant.merchantId;
    expect(await metadataKeysOf(t.storage.db, merchantId, { metadata: [] }, 100)).toEqual(['env', 'region', 'team']);
    expect(await metadataKeysOf(t.storage.db, merchantId, { metadata: [['team', 'ads']] }, 100)).toEqual(['region', 'team']);
    expect(await metadataKeysOf(t.storage.db, merchantId, { metadata: [] }, 2)).toEqual(['env', 'region']);
    expect(await metadataKeysOf(t.storage.db, 'mer_other', { metadata: [] }, 100)).toEqual([]);
  });
});
