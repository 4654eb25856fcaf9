//! The HostedClusterPackage rollout: the decision (`hosted_cluster_package`), the plan by groups and
//! budget, the rollout policy and its guard (soak, deadline, failures, rollback, health checks), the
//! status and the rollout events.

pub mod cluster_reads;
#[cfg(test)]
mod fleet_sim;
pub mod health_check;
pub mod hosted_cluster_package;
pub mod maintenance_window;
pub mod preflight_diff;
pub mod preflight_gate;
pub mod preflight_report;
pub mod rollout_calendar;
pub mod rollout_decision;
pub mod rollout_events;
pub mod rollout_guard;
pub mod rollout_plan;
pub mod rollout_policy;
pub mod rollout_simulation;
pub mod rollout_status;
pub mod rollout_targets;
pub mod step_status;
