import { formatMoney } from '../domain/money.ts';
import type { BillingInterval, RolloverType } from '../storage/schema.ts';
import type { SubscriptionView } from '../storage/subscriptions.ts';

type Money = string;
type PlanTerms = { name: string; period_amount: Money; included_credit: Money; billing_interval: BillingInterval; rollover_type: RolloverType; bundle_rollover_type: RolloverType };

/** A subscription as the API lists it; webhook events carry the same object. */
export type PresentedSubscription = {
  subscription_id: string;
  plan_id: string;
  customer_id: string;
  connection_id: string;
  status: 'active' | 'past_due' | 'cancelled';
  auto_top_up_bundle_id: string | null;
  started_at: string;
  cancelled_at: string | null;
  cycle_start_at: string | null;
  cycle_end_at: string | null;
  plan: PlanTerms;
  credits: { total_remaining: Money; cycle_remaining: Money; bundle_remaining: Money };
  pending_change: {
    type: 'cancellation' | 'downgrade' | 'upgrade';
    effective_at: string | null;
    plan_id?: string;
    name?: string;
    period_amount?: Money;
    included_credit?: Money;
  } | null;
  customer: { phone: string | null; email: string | null; first_name: string | null; last_name: string | null };
};

function pendingChange(v: SubscriptionView): PresentedSubscription['pending_change'] {
  if (v.status === 'cancelled') return null;
  if (Number(v.cancel_at_cycle_end) === 1) return { type: 'cancellation', effective_at: v.cycle_end_at };
  if (!v.pending_plan) return null;
  return {
    type: v.pending_plan.period_amount > v.plan.period_amount ? 'upgrade' : 'downgrade',
    effective_at: v.cycle_end_at,
    plan_id: v.pending_plan.id,
    name: v.pending_plan.name,
    period_amount: formatMoney(v.pending_plan.period_amount),
    included_credit: formatMoney(v.pending_plan.included_credit),
  };
}

export function presentSubscription(v: SubscriptionView): PresentedSubscription {
  const live = v.status !== 'cancelled';
  return {
    subscription_id: v.id,
    plan_id: v.plan_id,
    customer_id: v.connection_id,
    connection_id: v.connection_id,
    status: v.status === 'incomplete' ? 'active' : v.status,
    auto_top_up_bundle_id: v.auto_top_up_bundle_id,
    started_at: v.started_at,
    cancelled_at: v.cancelled_at,
    cycle_start_at: live ? v.cycle_start_at : null,
    cycle_end_at: live ? v.cycle_end_at : null,
    plan: {
      name: v.plan.name,
      period_amount: formatMoney(v.plan.period_amount),
      included_credit: formatMoney(v.plan.included_credit),
      billing_interval: v.plan.billing_interval,
      rollover_type: v.plan.rollover_type,
      bundle_rollover_type: v.plan.bundle_rollover_type,
    },
    credits: {
      total_remaining: formatMoney(v.cycle_credit + v.bundle_credit),
      cycle_remaining: formatMoney(v.cycle_credit),
      bundle_remaining: formatMoney(v.bundle_credit),
    },
    pending_change: pendingChange(v),
    customer: v.contact,
  };
}

