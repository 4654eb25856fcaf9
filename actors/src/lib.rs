//! pko's object engine and the actor system that drives it.
//!
//! `engine` is the functional core (probes, adoption, desired objects, status, hashing): plain functions,
//! tested without a server. `applier`, `object_cache` and `phase_runner` do the apiserver I/O the engine
//! decides on. The actors (`object_set_actor`, `phase_actor`, the feeds) hold state, timers and routing and
//! call the two.

pub mod admission;
pub mod applier;
pub mod cluster_client;
pub mod connector_actor;
pub mod connector_deployment;
pub mod connector_hub;
pub mod connector_link;
pub mod context;
pub mod deployment_object;
pub mod engine;
pub mod hcp_namespace_actor;
pub mod hosted_cluster_actor;
pub mod hosted_cluster_fleet;
pub mod hosted_cluster_package_actor;
pub mod hosted_cluster_package_object;
pub mod hosted_phase;
pub mod hypershift_detector;
pub mod kind_feed;
pub mod leader_lease;
pub mod manager;
pub mod object_cache;
pub mod object_deployment_actor;
pub mod object_meta;
pub mod object_set_actor;
pub mod object_set_plan;
pub mod object_template_actor;
pub mod package_actor;
pub mod package_object;
pub mod phase_actor;
pub mod phase_runner;
pub mod process_main;
pub mod pull_secrets;
pub mod reconcile_gate;
pub mod registry;
pub mod remote_phase_actor;
pub mod rollout_publisher;

pub mod set_object;
pub mod template_object;
