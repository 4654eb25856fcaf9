//! The object engine's rules: what an ObjectSet's objects are (desired objects, reserved ones, whose
//! identity applies them), adoption and drift, probes and the phase verdict, ObjectSet status,
//! ObjectDeployment revision plans and template hashes, ObjectTemplate rendering, immutable fields, and
//! the merge patch between two statuses.

pub mod adoption;
pub mod apply_identity;
pub mod deployment_plan;
pub mod desired_object;
pub mod drift;
pub mod object_ref;
pub mod object_set_plan;
pub mod object_set_status;
pub mod object_template;
pub mod phase_plan;
pub mod phase_verdict;
pub mod probe;
pub mod reserved_objects;
pub mod status_patch;
pub mod template_hash;
