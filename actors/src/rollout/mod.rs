//! HostedClusterPackage rollouts: the supervisor per HostedClusterPackage, the actor per HCP namespace,
//! the index of HostedClusters they select from, the JetStream event publisher, and the preflight of a
//! release (its render, diff and dry runs, locally and through the connectors). The rollout
//! decision itself is `engine::rollout::rollout_decision::decide_rollout` over `engine::rollout::rollout_plan`.

pub mod hcp_namespace_actor;
pub mod health_queries;
pub mod hosted_cluster_index;
pub mod hosted_cluster_package_actor;
pub mod preflight_connector;
pub mod preflight_runner;
pub mod preflight_tracker;
pub mod rollout_publisher;
