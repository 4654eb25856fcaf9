//! The functional core: rules as plain functions over plain data, with no I/O and no actors.

pub mod adoption;
pub mod api_time;
pub mod conditions;
pub mod deployment_plan;
pub mod desired_object;
pub mod drift;
pub mod health_check;
pub mod hosted_cluster_package;
pub mod hosted_teardown;
pub mod immutable_fields;
pub mod label_selector;
pub mod object_ref;
pub mod object_set_status;
pub mod object_template;
pub mod package_deployment;
pub mod phase_verdict;
pub mod probe;
pub mod promotion_gate;
pub mod rollout_events;
pub mod rollout_guard;
pub mod rollout_plan;
pub mod rollout_policy;
pub mod rollout_status;
pub mod shard_assignment;
pub mod template_hash;
pub mod transition_events;
