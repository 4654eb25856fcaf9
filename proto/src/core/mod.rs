//! `package-operator.run/v1alpha1`: every kind of the core API, with its CRD facts.

pub mod common;
pub mod hosted_cluster_package;
pub mod object_deployment;
pub mod object_set;
pub mod object_set_phase;
pub mod object_slice;
pub mod object_template;
pub mod package;
pub mod resource;
pub mod rollout_calendar;
pub mod rollout_notifications;
pub mod rollout_preflight;

pub use common::*;
pub use hosted_cluster_package::*;
pub use object_deployment::*;
pub use object_set::*;
pub use object_set_phase::*;
pub use object_slice::*;
pub use object_template::*;
pub use package::*;
pub use resource::{crd_for, ApiKind, Column, CrdError, KindInfo};
pub use rollout_calendar::*;
pub use rollout_notifications::*;
pub use rollout_preflight::*;
