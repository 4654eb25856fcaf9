//! The preflight of a HostedClusterPackage's release (pko extension): what the policy says of it, the
//! compact result kept in `status.preflight`, and the full report `kubectl package rollout diff` shows
//! (kept in a ConfigMap next to the manager, since it outgrows a status).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the rollout does with a release the apiserver refuses somewhere.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackagePreflightPolicy {
    /// `Hold` (default): no Package is updated while the preflight of the current template runs, nor
    /// while it found a refusal that was not accepted
    /// (`kubectl package rollout approve hostedclusterpackage/NAME --preflight`). `Proceed`: the
    /// preflight only reports.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub on_refusal: PreflightOnRefusal,
}

/// See [`HostedClusterPackagePreflightPolicy::on_refusal`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PreflightOnRefusal {
    #[default]
    Hold,
    Proceed,
}

/// The last preflight: counts, the groups of identical change, the first refusals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackagePreflightStatus {
    /// The template hash it was run for.
    pub template_hash: String,
    /// The hash of what else the render depends on (the targets and their HostedClusters' data); a
    /// new one runs the preflight again.
    pub inputs_hash: String,
    /// SHA-256 over the groups' digests: what an approval of this change names.
    pub digest: String,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// HCP namespaces compared.
    #[serde(default)]
    pub namespaces: i32,
    /// Namespaces where something changes.
    #[serde(default)]
    pub changed: i32,
    /// Namespaces where the apiserver refused a change.
    #[serde(default)]
    pub refused: i32,
    /// Namespaces where a change could not be checked (see the report for why).
    #[serde(default)]
    pub unchecked: i32,
    /// The groups of identical change, largest first (at most 10; the report has all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<PreflightGroupSummary>,
    /// The first refusals (at most 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<PreflightRefusal>,
    /// The ConfigMap holding the full report, `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub report: String,
    /// Why the full report could not be kept, if it could not (the status still says what was found).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub report_error: String,
    /// The value of the request annotation (`rollout.package-operator.run/preflight`) it answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request: String,
}

/// One group of HCP namespaces whose change is identical.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightGroupSummary {
    /// SHA-256 of the change (first 16 hex digits).
    pub digest: String,
    /// How many namespaces.
    pub namespaces: i32,
    /// The change in a line, e.g. `Deployment addon: 2 fields (…)`.
    pub summary: String,
    /// The apiserver refused part of it.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub refused: bool,
}

/// One refused object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightRefusal {
    pub namespace: String,
    /// `<kind> <name>`.
    pub object: String,
    /// The apiserver's message.
    pub message: String,
}

/// The full preflight, as `kubectl package rollout diff` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightReport {
    pub template_hash: String,
    pub inputs_hash: String,
    pub digest: String,
    pub finished_at: String,
    /// The groups of identical change, largest first.
    pub groups: Vec<PreflightGroup>,
    /// What the report leaves out to stay within its size limit, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
}

/// HCP namespaces with the same change: its objects, each with a unified diff, written with
/// `$(namespace)` and `$(hostedCluster)` for what differs only by the namespace it is in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightGroup {
    pub digest: String,
    pub namespaces: Vec<String>,
    pub summary: String,
    /// The objects that change (none: nothing changes there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<PreflightObjectChange>,
    /// Why the namespace could not be compared at all (the render failed), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<String>,
}

/// One object of a group's change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightObjectChange {
    pub phase: String,
    /// Applied in the hosted cluster (through its connector), not the management cluster.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub hosted: bool,
    /// `<apiVersion> <kind> <name>` (and ` in <namespace>` when it names one).
    pub object: String,
    /// `Create`, `Update` or `Delete`.
    pub action: String,
    /// The fields that change (paths; at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// `Accepted`, `Refused` or `Unchecked` by the apiserver's dry run.
    pub verdict: String,
    /// The refusal, or why it was not checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The unified diff of the object's YAML.
    pub diff: String,
}
