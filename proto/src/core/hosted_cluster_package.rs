//! HostedClusterPackage: one Package rolled out progressively to the HCP namespace of every selected
//! HostedCluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::package::PackageTemplateSpec;
use super::resource::{
    api_kind, condition_column, integer_column, wide_column, Column, KindInfo, AGE_COLUMN,
};

/// Desired state of a HostedClusterPackage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageSpec {
    /// How updates progress (default `instant`, as in Package Operator).
    #[serde(default)]
    #[schemars(extend("default" = {"instant": {}}))]
    pub strategy: HostedClusterPackageStrategy,
    /// HostedClusters that get the Package; empty selects all.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub hosted_cluster_selector: LabelSelector,
    /// The Package created in each selected HostedCluster's HCP namespace.
    pub template: PackageTemplateSpec,
    /// Groups of HostedClusters updated one group after another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<HostedClusterPackagePartitionSpec>,
    /// pko extension: start rolling out a template only once other management clusters of the fleet
    /// rolled it out and kept it available for a soak time (read through the fleet's hub NATS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<HostedClusterPackagePromotion>,
}

/// A promotion gate: the management clusters that go first, and how long they soak. Named clusters and
/// selected ones both count; at least one of the two is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct HostedClusterPackagePromotion {
    /// Management clusters (their `--cluster-name`) that must have settled on the template first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 50),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub management_clusters: Vec<String>,
    /// Management clusters selected by the labels their managers announce (`--cluster-labels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub management_cluster_selector: Option<LabelSelector>,
    /// Seconds each of them must have stayed settled (every Package updated and live, the rollout
    /// Available) on the template before this rollout starts (default 0).
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    #[schemars(range(min = 0))]
    pub soak_seconds: i64,
}

/// Rollout strategy: exactly one of the fields is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("maxProperties" = 1))]
pub struct HostedClusterPackageStrategy {
    /// Update every Package at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instant: Option<HostedClusterPackageStrategyInstant>,
    /// Update Packages while at most `maxUnavailable` are unavailable or updating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_upgrade: Option<HostedClusterPackageStrategyRollingUpgrade>,
}

impl Default for HostedClusterPackageStrategy {
    fn default() -> Self {
        Self {
            instant: Some(HostedClusterPackageStrategyInstant {}),
            rolling_upgrade: None,
        }
    }
}

/// The instant strategy has no parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HostedClusterPackageStrategyInstant {}

/// Rolling upgrade parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageStrategyRollingUpgrade {
    /// Packages that may be unavailable or updating at the same time, counting those already
    /// unavailable; at least 1 (default 1).
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1), extend("default" = 1))]
    pub max_unavailable: i32,
}

impl Default for HostedClusterPackageStrategyRollingUpgrade {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
        }
    }
}

fn default_max_unavailable() -> i32 {
    1
}

/// Partitions HostedClusters by the value of one label.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackagePartitionSpec {
    /// Label whose value names a HostedCluster's group.
    #[schemars(length(min = 1))]
    pub label_key: String,
    /// Group order (default alphanumeric ascending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<HostedClusterPackagePartitionOrderSpec>,
}

/// Order of partition groups: exactly one of the fields is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct HostedClusterPackagePartitionOrderSpec {
    /// Groups in this order; other values and unlabeled HostedClusters form the unknown group, last.
    #[serde(default, rename = "static", skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 20),
        inner(length(max = 63), regex(pattern = r"^(\*|([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub static_: Vec<String>,
    /// Groups in ascending byte order of their label values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alphanumeric_asc: Option<HostedClusterPackagePartitionOrderAlphanumericAsc>,
}

/// Alphanumeric ascending order has no parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HostedClusterPackagePartitionOrderAlphanumericAsc {}

/// Package counts, for the whole fleet or one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageCounts {
    /// Packages that exist for selected HostedClusters.
    #[serde(default)]
    pub total_packages: i32,
    /// Packages whose spec equals the template.
    #[serde(default)]
    pub updated_packages: i32,
    /// Packages Available=True at their current generation.
    #[serde(default)]
    pub available_packages: i32,
    /// Packages not available (these count against maxUnavailable).
    #[serde(default)]
    pub unavailable_packages: i32,
    /// Packages updated and Progressing=False.
    #[serde(default)]
    pub progressed_packages: i32,
    /// pko: Packages updated whose latest revision is not live yet (and not failing). They hold a
    /// maxUnavailable slot.
    #[serde(default)]
    pub in_flight_packages: i32,
    /// pko: Packages updated that report why their latest revision cannot become live (failing probes,
    /// invalid, not unpacking). They hold a maxUnavailable slot and halt the rollout in their group.
    #[serde(default)]
    pub failed_packages: i32,
}

/// Observed state of a HostedClusterPackage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageStatus {
    /// Available, Progressing and HasPausedPackage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Generation this status describes.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub observed_generation: i64,
    /// Fleet-wide counts.
    #[serde(flatten)]
    pub counts: HostedClusterPackageCounts,
    /// Counts per partition group, in rollout order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<HostedClusterPackagePartitionStatus>,
    /// Packages being updated right now; written before the updates so a restart never exceeds the budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processing: Vec<HostedClusterPackageRefStatus>,
    /// pko: the template whose promotion gate opened. The rollout of that template goes on whatever the
    /// fleet reports after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<HostedClusterPackagePromotionStatus>,
}

/// A promotion gate that opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackagePromotionStatus {
    /// The hash of the Package template the gate opened for.
    pub template_hash: String,
    /// When it opened (RFC 3339).
    pub opened_at: String,
}

/// Counts of one partition group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackagePartitionStatus {
    /// Group name: the label value, or the implicit unknown group.
    pub name: String,
    /// Position of the group in the rollout, starting at 0.
    #[serde(default)]
    pub order: i32,
    /// Package counts of the group.
    #[serde(flatten)]
    pub counts: HostedClusterPackageCounts,
}

/// A Package being updated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageRefStatus {
    /// Package UID.
    pub uid: String,
    /// Package name.
    pub name: String,
    /// Package namespace (the HCP namespace).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

const HOSTED_CLUSTER_PACKAGE_COLUMNS: &[Column] = &[
    condition_column(
        "Available",
        r#".status.conditions[?(@.type=="Available")].status"#,
    ),
    condition_column(
        "Progressing",
        r#".status.conditions[?(@.type=="Progressing")].status"#,
    ),
    condition_column(
        "Paused",
        r#".status.conditions[?(@.type=="HasPausedPackage")].status"#,
    ),
    integer_column("Updated", ".status.updatedPackages"),
    integer_column("Total", ".status.totalPackages"),
    integer_column("Unavailable", ".status.unavailablePackages"),
    integer_column("Failed", ".status.failedPackages"),
    AGE_COLUMN,
    wide_column("Image", ".spec.template.spec.image"),
    wide_column(
        "Message",
        r#".status.conditions[?(@.type=="Progressing")].message"#,
    ),
];

api_kind! {
    /// Rolls a Package out to the HCP namespace of every selected HostedCluster, group by group, within
    /// an unavailability budget.
    pub struct HostedClusterPackage {
        pub spec: HostedClusterPackageSpec,
    }
    status: HostedClusterPackageStatus,
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "HostedClusterPackage",
        plural: "hostedclusterpackages",
        namespaced: false,
        short_names: &["hcpkg"],
        columns: HOSTED_CLUSTER_PACKAGE_COLUMNS,
        status_default_phase: None,
    },
}
