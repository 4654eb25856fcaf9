//! What the manager exposes on `/metrics`: one prometheus-client registry ([`manager_metrics`]) holding
//! pko's own metrics (applies, rollouts, connectors, package images, with the runtime's: reconciles,
//! apiserver requests, Leases and shards, defined in `runtime/`) and
//! Package Operator's metrics under their upstream names and labels ([`upstream_metrics`]), so existing
//! dashboards and alerts keep working. These modules record and encode; they decide nothing, and the
//! actors call them with what they observed.

pub mod connector_metrics;
pub mod exposition;
pub mod fleet_metrics;
pub mod listener_metrics;
pub mod managed_cache;
pub mod manager_metrics;
pub mod notification_metrics;
pub mod package_images;
pub mod preflight_metrics;
pub mod rollout_metrics;
pub mod source_labels;
pub mod upstream_metrics;
