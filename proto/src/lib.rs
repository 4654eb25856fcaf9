//! pko's contract with the outside world: the `package-operator.run/v1alpha1` kinds, the
//! `manifests.package-operator.run/v1alpha1` package file formats, the HyperShift `HostedCluster`
//! subset pko reads, the CRDs generated from those types, and the NATS protocol between the manager and
//! the hosted-cluster connectors with the credentials that confine a connector to its own subjects.
//!
//! Types here are plain data with serde. They mirror Package Operator's JSON field for field, so existing
//! Package Operator YAML deserializes unchanged. Where the CRD declares a default, the serde default is the
//! same value, so a typed object and the apiserver's stored copy agree. This crate holds no behaviour beyond
//! (de)serialization, schema generation, credential signing, NATS permission sets and small accessors: rules
//! live in `engine/`, I/O in `actors/`.

pub mod connector_wire;
pub mod core;
pub mod crds;
pub mod fleet;
pub mod hypershift;
pub mod manifests;
pub mod nats_credentials;
pub mod nats_permissions;
pub mod rollout_events;
mod schema;
mod string_enum;
pub mod well_known;

/// API group of the core kinds.
pub const GROUP: &str = "package-operator.run";
/// API group of the package file formats (PackageManifest, PackageManifestLock).
pub const MANIFESTS_GROUP: &str = "manifests.package-operator.run";
/// The only version of both groups.
pub const VERSION: &str = "v1alpha1";
