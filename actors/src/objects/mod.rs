//! The object engine's actors and I/O: ObjectSets (with their phases and delegated ObjectSetPhases),
//! ObjectDeployments, ObjectTemplates, the views of those objects they write through, the applier, the
//! managed-object cache and the index of the deployments' ObjectSets. The rules they follow are in
//! `engine/`; this folder does the API calls, timers and messages.

pub mod applier;
pub mod deployment_object;
pub mod object_cache;
pub mod object_deployment_actor;
pub mod object_dry_run;
pub mod object_meta;
pub mod object_set_actor;
pub mod object_template_actor;
pub mod owner_identity;
pub mod phase_actor;
pub mod phase_runner;
pub mod revision_index;
pub mod set_object;
pub mod set_plan_inputs;
pub mod template_object;
