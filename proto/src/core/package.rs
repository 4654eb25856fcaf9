//! Package and ClusterPackage: an installation of a package image.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::resource::{
    api_kind, condition_column, integer_column, wide_column, Column, KindInfo, AGE_COLUMN,
    PHASE_COLUMN,
};

/// What to install.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageSpec {
    /// OCI image holding the package.
    pub image: String,
    /// Configuration, admitted against the package's `config.openAPIV3Schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserved_object")]
    pub config: Option<serde_json::Value>,
    /// Component of a multi-component package to install.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub component: String,
    /// When true, neither the Package nor its children are reconciled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// Observed state of a Package.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageStatus {
    /// Available, Progressing, Unpacked, Invalid, Paused and mapped `domain/Type` conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Summary for `kubectl get`; not an API contract, read the conditions instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Hash of image and config last unpacked successfully.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unpacked_hash: String,
    /// Revision reported by the ObjectDeployment.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub revision: i64,
}

/// A Package as templated by a HostedClusterPackage: metadata and spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageTemplateSpec {
    /// Labels and annotations of each created Package.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    #[schemars(schema_with = "crate::schema::template_object_meta")]
    pub metadata: ObjectMeta,
    /// Spec of each created Package.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub spec: PackageSpec,
}

const PACKAGE_COLUMNS: &[Column] = &[
    PHASE_COLUMN,
    condition_column(
        "Available",
        r#".status.conditions[?(@.type=="Available")].status"#,
    ),
    condition_column(
        "Progressing",
        r#".status.conditions[?(@.type=="Progressing")].status"#,
    ),
    condition_column(
        "Unpacked",
        r#".status.conditions[?(@.type=="Unpacked")].status"#,
    ),
    condition_column(
        "Invalid",
        r#".status.conditions[?(@.type=="Invalid")].status"#,
    ),
    integer_column("Revision", ".status.revision"),
    wide_column("Image", ".spec.image"),
    AGE_COLUMN,
];

api_kind! {
    /// A namespaced installation of a package image.
    pub struct Package {
        pub spec: PackageSpec,
    }
    status: PackageStatus,
    scope: NamespaceResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "Package",
        plural: "packages",
        namespaced: true,
        short_names: &["pkg"],
        columns: PACKAGE_COLUMNS,
        status_default_phase: Some("Pending"),
    },
}

api_kind! {
    /// A cluster-scoped installation of a package image.
    pub struct ClusterPackage {
        pub spec: PackageSpec,
    }
    status: PackageStatus,
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ClusterPackage",
        plural: "clusterpackages",
        namespaced: false,
        short_names: &["clpkg"],
        columns: PACKAGE_COLUMNS,
        status_default_phase: Some("Pending"),
    },
}
