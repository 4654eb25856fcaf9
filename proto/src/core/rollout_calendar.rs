//! When a HostedClusterPackage's rollout may touch a HostedCluster (pko extension): maintenance windows a
//! HostedCluster names by label, the policy's default window, and HostedClusters left out of the rollout
//! until an expiry; with what the status says of them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A duration as the rollout policy takes it (`90s`, `1h30m`, `500ms`, `0`): what
/// `engine::rollout::rollout_policy::parse_duration` reads, checked by the apiserver first.
pub const DURATION_PATTERN: &str = r"^(0|([0-9]+(ms|s|m|h))+)$";

/// A recurring maintenance window: it opens at every time `schedule` names, in `timeZone`, and stays
/// open for `duration`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageMaintenanceWindow {
    /// What HostedClusters name it by, in their `rollout.package-operator.run/maintenance-window` label.
    pub name: String,
    /// When it opens, in cron form: five fields (minute, hour, day of month, month, day of week) or six
    /// with seconds first. The day of week is written by name (`Sat`, `Mon-Fri`), since numbers mean
    /// different days in different cron dialects; a day must match both the day of month and the day of
    /// week.
    #[schemars(length(max = 256), regex(pattern = r"^\S+( +\S+){4,5}$"))]
    pub schedule: String,
    /// How long it stays open (`4h`, `90m`); at most 744h.
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub duration: String,
    /// The IANA time zone `schedule` is read in (`Europe/Berlin`); default `UTC`. Across a daylight
    /// saving change, a start time that does not exist that day opens an hour later, and one that exists
    /// twice opens at the first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub time_zone: String,
}

/// HostedClusters left out of the rollout until `until`: they neither hold their group nor count as
/// failed, and their Package is left as it is. At least one of `namespaces` and `selector` is set; a
/// HostedCluster either names is left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "has(self.namespaces) || has(self.selector)", "message": "set namespaces, selector or both"}]))]
pub struct HostedClusterPackageSkip {
    /// HCP namespaces to leave out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// HostedClusters to leave out, by their labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// When they come back into the rollout (RFC 3339, read against the manager's clock like a window).
    #[schemars(extend("format" = "date-time"))]
    pub until: String,
    /// Why (shown in status, events and `kubectl package rollout status`).
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
}

/// A HostedCluster left out of the rollout right now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageSkippedStatus {
    /// Its HCP namespace.
    pub namespace: String,
    /// When it comes back (RFC 3339); absent for a HostedCluster naming a maintenance window the policy
    /// does not define, which comes back when its label or the policy changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    pub reason: String,
}

impl HostedClusterPackageSkippedStatus {
    /// When it comes back, as status, events and the CLI say it.
    pub fn comes_back(&self) -> String {
        match &self.until {
            Some(until) => format!("until {until}"),
            None => "until its label or the policy changes".to_owned(),
        }
    }
}
