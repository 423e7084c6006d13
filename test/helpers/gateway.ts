import type { DestinationStream } from 'pino';
import { startTestApp, type TestApp } from './app.ts';
import type { CallJournal } from '../../src/ledger/journal/journal.ts';
import type { TestDatabase } from './databases.ts';
import { startMockUpstream, type MockUpstream } from './mock-upstream.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { resolveForwardCredential } from '../../src/gateway/credentials.ts';
import { estimateHold, type HoldEstimate } from '../../src/gateway/hold-estimate.ts';
import { pricingFor } from '../../src/ledger/billing.ts';

export type MockGateway = { upstream: MockUpstream; t: TestApp; base: string };

/** The /v1/forward query naming OpenAI's chat completions: `u=<the percent-encoded URL>`. */
export const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;

/** OpenAI, Anthropic and Gemini, each with a managed key: the providers most gateway tests call. */
export const THREE_PROVIDERS = {
  providerHosts: ['api.openai.com', 'api.anthropic.com', 'generativelanguage.googleapis.com'],
  providerKeys: { openai: 'sk-managed-openai', anthropic: 'sk-ant-managed', google: 'goog-managed' },
};

/**
 * A listening test app whose `providerHosts` all lead to one fresh mock upstream, with
 * `providerKeys` as its managed keys (PROVIDER_KEYS). `env` adds any other setting. The caller
 * closes both the app and the upstream.
 */
export async function startGatewayOnMock(
  dialect: TestDatabase['dialect'],
  opts: { providerHosts: string[]; providerKeys: Record<string, string>; env?: Record<string, string>; logStream?: DestinationStream; database?: TestDatabase; journal?: CallJournal },
): Promise<MockGateway> {
  const upstream = await startMockUpstream();
  let t: TestApp | undefined;
  try {
    t = await startTestApp(dialect, {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify(Object.fromEntries(opts.providerHosts.map((host) => [host, upstream.url]))),
        PROVIDER_KEYS: JSON.stringify(opts.providerKeys),
        ...opts.env,
      },
      ...(opts.logStream ? { logStream: opts.logStream } : {}),
      ...(opts.database ? { database: opts.database } : {}),
      ...(opts.journal ? { journal: opts.journal } : {}),
    });
    return { upstream, t, base: await t.listen() };
  } catch (error) {
    // The caller never sees what was started here, so it cannot close it.
    await t?.close();
    await upstream.close();
    throw error;
  }
}

/** The hold the gateway places for an OpenAI request sent with this credential, computed with its own functions. */
export async function openaiHoldOf(t: TestApp, credential: string, requestBody: { model: string }): Promise<HoldEstimate> {
  const billing = await resolveForwardCredential(t.storage, credential, new Date(t.clock.now()));
  return estimateHold({
    requestBody,
    pricing: pricingFor(billing).pricing,
    prices: lookupBasePrices('openai', requestBody.model, { overrides: t.config.priceOverrides }),
    baseCostCharged: true,
    serviceChargeRate: billing.serviceChargeRate ?? t.config.serviceChargeRate,
    defaultOutputCap: t.config.defaultMaxOutputTokens,
  });
}
