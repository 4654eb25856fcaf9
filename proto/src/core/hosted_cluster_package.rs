//! HostedClusterPackage: one Package rolled out progressively to the HCP namespace of every selected
//! HostedCluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::package::PackageTemplateSpec;
use super::resource::{
    api_kind, condition_column, integer_column, wide_column, Column, KindInfo, AGE_COLUMN,
};
use super::rollout_calendar::{
    HostedClusterPackageMaintenanceWindow, HostedClusterPackageSkip,
    HostedClusterPackageSkippedStatus,
};
use super::rollout_notifications::HostedClusterPackageNotificationSink;
use super::rollout_preflight::{
    HostedClusterPackagePreflightPolicy, HostedClusterPackagePreflightStatus,
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
    /// pko extension: hold the rollout where it stands. Nothing is created or updated while set; Packages
    /// already updated keep their template.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub paused: bool,
    /// pko extension: soak times, progress deadlines, failure budgets, approvals, health checks and
    /// rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_policy: Option<HostedClusterPackageRolloutPolicy>,
}

/// How carefully a rollout proceeds and what happens when it goes wrong (pko extension).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageRolloutPolicy {
    /// What every partition group gets unless `groups` says otherwise.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub defaults: HostedClusterPackageGroupPolicy,
    /// Per-group settings, by group name (the partition label value; `unknown` for the unknown group and
    /// for a rollout without partitions). A field set here replaces the default's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub groups: Vec<HostedClusterPackageNamedGroupPolicy>,
    /// What a halted rollout does: `Manual` (default) stays where it halted until `kubectl package rollout
    /// undo` or a new template; `Automatic` returns every Package to the last template that finished
    /// rolling out everywhere.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub rollback: HostedClusterPackageRollback,
    /// What a release the apiserver refuses in its preflight does to the rollout.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub preflight: HostedClusterPackagePreflightPolicy,
    /// Maintenance windows, by name. A HostedCluster names its window in its
    /// `rollout.package-operator.run/maintenance-window` label; its Package is created and updated only
    /// while that window is open, and its group's progress deadlines and soak count only open time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // A map keyed by name: the apiserver refuses a name listed twice ("Duplicate value").
    #[schemars(
        length(max = 20),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub maintenance_windows: Vec<HostedClusterPackageMaintenanceWindow>,
    /// The window of HostedClusters that name none. Unset: they may be updated at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_maintenance_window: Option<String>,
    /// HostedClusters left out of the rollout until an expiry, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub skip: Vec<HostedClusterPackageSkip>,
    /// HTTP sinks that receive the rollout's events as CloudEvents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub notifications: Vec<HostedClusterPackageNotificationSink>,
}

/// What a halted rollout does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum HostedClusterPackageRollback {
    /// Stay halted until told (`kubectl package rollout undo`) or the template changes.
    #[default]
    Manual,
    /// Roll back to the last template that finished rolling out everywhere.
    Automatic,
}

/// The settings of one partition group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageGroupPolicy {
    /// How long every Package of the group must stay updated and live before the group counts as
    /// finished and the next one starts (`90s`, `10m`, `1h30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::core::rollout_calendar::DURATION_PATTERN))]
    pub min_success_time: Option<String>,
    /// A Package updated and not live within this long counts as failed (`10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::core::rollout_calendar::DURATION_PATTERN))]
    pub progress_deadline: Option<String>,
    /// Failed Packages the group tolerates (a number or a percentage of its Packages, rounded down);
    /// one more halts the rollout. Unset: failures wait in their group and never halt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<IntOrString>,
    /// The group starts only once approved for the current template
    /// (`kubectl package rollout approve hostedclusterpackage/NAME --group G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_approval: Option<bool>,
    /// Prometheus instant queries that must hold while the group soaks; one that does not fails the
    /// group and halts the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 10))]
    pub health_checks: Option<Vec<HostedClusterPackageHealthCheck>>,
}

/// Group settings for one named group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageNamedGroupPolicy {
    /// The group: a partition label value, or `unknown`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Its settings.
    #[serde(flatten)]
    pub policy: HostedClusterPackageGroupPolicy,
}

/// A Prometheus instant query and the bounds every sample of its result must keep.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageHealthCheck {
    /// Names the check in status and events.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// PromQL, evaluated as an instant query against the manager's `--prometheus-url`. A result without
    /// samples is no evidence either way: the soak does not end on it (write `or vector(0)` where no
    /// series means healthy).
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// Every sample must be at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Every sample must be at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
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
#[schemars(extend("x-kubernetes-validations" = [{"rule": "!(has(self.instant) && has(self.rollingUpgrade))", "message": "set at most one of instant and rollingUpgrade"}]))]
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
    /// unavailable: a number (at least 1) or, a pko extension, a percentage of the selected Packages
    /// (rounded down, at least 1). Default 1.
    #[serde(default = "default_max_unavailable")]
    #[schemars(extend(
        "default" = 1,
        // Bounds the rule's cost: "100%" is the longest text taken.
        "maxLength" = 4,
        "x-kubernetes-validations" = [{"rule": "type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')", "message": "must be a number of at least 1 or a percentage from 1% to 100%"}]
    ))]
    pub max_unavailable: IntOrString,
}

impl Default for HostedClusterPackageStrategyRollingUpgrade {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
        }
    }
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
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
#[schemars(extend("x-kubernetes-validations" = [{"rule": "has(self.static) != has(self.alphanumericAsc)", "message": "set exactly one of static and alphanumericAsc"}]))]
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
    /// pko: the last template that finished rolling out everywhere: what a rollback returns to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_succeeded: Option<HostedClusterPackageSucceededTemplate>,
    /// pko: the template the rollout halted on, why, and whether it rolls back. Cleared when the spec's
    /// template changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<HostedClusterPackageHalt>,
    /// pko: the last preflight of a release: what changes where, and what the apiserver refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<HostedClusterPackagePreflightStatus>,
    /// pko: HostedClusters left out of the rollout right now (`spec.rolloutPolicy.skip`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<HostedClusterPackageSkippedStatus>,
}

/// A template that finished rolling out everywhere.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageSucceededTemplate {
    /// Its hash (as `kubectl package rollout approve` and the fleet's records name it).
    pub template_hash: String,
    /// The template itself.
    pub template: PackageTemplateSpec,
    /// When every Package was first seen updated and live on it (RFC 3339).
    pub finished_at: String,
}

/// Why and where a rollout halted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageHalt {
    /// The hash of the template that halted; not rolled out again until the spec's template changes.
    pub template_hash: String,
    /// `MaxFailuresExceeded`, `HealthCheckFailed` or `RollbackRequested`.
    pub reason: String,
    /// What happened, naming the group, the Packages or the check.
    pub message: String,
    /// When it halted (RFC 3339).
    pub halted_at: String,
    /// Whether Packages are returned to `lastSucceeded`.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub rolling_back: bool,
    /// When every Package was back on `lastSucceeded` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_at: Option<String>,
}

/// One group's approval, as kept in the approvals annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutApproval {
    /// The template hash the group was approved for.
    pub template_hash: String,
    /// Who approved it (the kubeconfig user of `kubectl package rollout approve`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub approved_by: String,
    /// When (RFC 3339).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub approved_at: String,
    /// The preflight digest of the change that was reviewed: the approval counts only while the
    /// preflight finds that same change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preflight_digest: String,
}

/// The approvals annotation: approvals by group name.
pub type RolloutApprovals = std::collections::BTreeMap<String, RolloutApproval>;

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
    /// pko: `Pending`, `AwaitingApproval`, `AwaitingPreflight`, `WaitingForWindow`, `Progressing`,
    /// `Soaking`, `Finished`, `Failed` or `RollingBack`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// pko: since when every Package of the group has been updated and live on `templateHash` (RFC 3339);
    /// the soak counts from here, across manager restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_since: Option<String>,
    /// pko: the template `doneSince` is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// pko: the failed Packages of the group, by namespace (at most 20 named).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
    /// pko: the last result of each health check while the group soaks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<HostedClusterPackageHealthCheckStatus>,
    /// pko: members whose Package is to be created or updated and whose maintenance window is closed.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub waiting_for_window: i32,
    /// pko: when the first of their windows opens next (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window_start: Option<String>,
}

/// The last evaluation of a health check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageHealthCheckStatus {
    /// The check's name.
    pub name: String,
    /// `Passing`, `Failing` or `Unknown` (no samples, or Prometheus not reachable).
    pub state: String,
    /// What was seen.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When (RFC 3339).
    pub checked_at: String,
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
    /// pko: when the update was decided (RFC 3339); the progress deadline counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
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
