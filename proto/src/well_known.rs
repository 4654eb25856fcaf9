//! Well-known label, annotation and finalizer names of the package-operator.run API that more than one
//! crate spells.

/// Label on a package's objects and ObjectDeployment: the name of its PackageManifest.
pub const PACKAGE_LABEL: &str = "package-operator.run/package";
/// Label on a package's objects and ObjectDeployment: the name of the Package instance.
pub const INSTANCE_LABEL: &str = "package-operator.run/instance";
