//! The workload simulator (pko-testenv) with the readiness lag these tests assume.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::Client;
#[allow(unused_imports)]
pub use pko_testenv::workload::{widget_resource, WorkloadSimulator, WIDGET_GROUP};

/// How long a workload takes to become ready after it changed.
pub const READINESS_LAG: Duration = Duration::from_secs(1);

/// Installs the Widget CRD in `group`.
pub async fn install_widget_crd(client: &Client, group: &str) {
    pko_testenv::workload::install_widget_crd(client, group)
        .await
        .unwrap();
}

/// Widgets in `namespaces` ready [`READINESS_LAG`] after each change.
pub fn widgets(client: &Client, namespaces: BTreeSet<String>) -> WorkloadSimulator {
    WorkloadSimulator::widgets(client, namespaces, READINESS_LAG)
}

/// Deployments in `namespaces` ready [`READINESS_LAG`] after each change.
pub fn deployments(client: &Client, namespaces: BTreeSet<String>) -> WorkloadSimulator {
    WorkloadSimulator::deployments(client, namespaces, READINESS_LAG)
}
