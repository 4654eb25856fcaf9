//! HostedClusterPackage rollouts: the supervisor per HostedClusterPackage, the actor per HCP namespace,
//! the index of HostedClusters they select from, and the JetStream event publisher. The rollout
//! decision itself is `engine::rollout::rollout_decision::decide_rollout` over `engine::rollout::rollout_plan`.

pub mod hcp_namespace_actor;
pub mod health_queries;
pub mod hosted_cluster_index;
pub mod hosted_cluster_package_actor;
pub mod rollout_publisher;
