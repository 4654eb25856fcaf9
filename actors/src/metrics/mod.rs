//! What the manager exposes on `/metrics`: one prometheus-client registry ([`manager_metrics`]) holding
//! pko's own metrics (reconciles, apiserver requests, applies, rollouts, connectors, package images) and
//! Package Operator's metrics under their upstream names and labels ([`upstream_metrics`]), so existing
//! dashboards and alerts keep working. These modules record and encode; they decide nothing, and the
//! actors call them with what they observed.

pub mod api_requests;
pub mod connector_metrics;
pub mod exposition;
pub mod fleet_metrics;
pub mod lease_metrics;
pub mod managed_cache;
pub mod manager_metrics;
pub mod package_images;
pub mod rollout_metrics;
pub mod shard_metrics;
pub mod source_labels;
pub mod upstream_metrics;

/// The text a registry filled by `register` encodes to: what the groups' unit tests read.
#[cfg(test)]
fn encoded(register: impl FnOnce(&mut prometheus_client::registry::Registry)) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
    text
}
