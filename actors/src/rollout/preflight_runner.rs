//! A HostedClusterPackage release's preflight, as the manager runs it (issue 43): the release rendered
//! for every target HCP namespace as its Package would render it, compared with what the namespace's
//! ObjectDeployment holds, each changed object put to the apiserver as a server-side dry run
//! (`dryRun=All`), the fleet grouped by identical change (`engine::rollout::preflight_diff`), and the full
//! report kept in a ConfigMap next to the manager for `kubectl package rollout diff`.
//!
//! It writes nothing but the report. It runs off the supervisor: renders on the blocking pool, at most
//! [`NAMESPACES_AT_ONCE`] namespaces at a time, the grouping on the blocking pool too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource};
use pko_package::canonical_hash::{hex, value_digest};
use pko_package::files::PackageFiles;
use pko_proto::core::common::ObjectSetTemplatePhase;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_deployment::ObjectDeployment;
use pko_proto::core::object_slice::ObjectSlice;
use pko_proto::core::package::{Package, PackageTemplateSpec};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::well_known::{HOSTED_CLUSTER_PACKAGE_LABEL, HOSTED_CLUSTER_PHASE_CLASS};
use serde_json::json;
use tracing::{info_span, Instrument};

use crate::engine::api_time::stamp;
use crate::engine::objects::desired_object::FIELD_MANAGER;
use crate::engine::packages::package_deployment::UnpackOutcome;
use crate::engine::rollout::hosted_cluster_package::desired_package;
use crate::engine::rollout::preflight_diff::{
    as_applied, object_changes, NamespacePreflight, ObjectChange, PhaseObjects, Verdict,
};
use crate::engine::rollout::preflight_gate::PreflightRun;
use crate::engine::rollout::preflight_report::{
    preflight_status, GroupedNamespace, PreflightGroups, REPORT_DIFF_TIME,
};
use crate::manager::context::ManagerContext;
use crate::objects::object_dry_run::{dry_run, Introduced};
use crate::packages::package_object::PackageObject;
use crate::packages::package_render::{pull_package, render_package};
use crate::rollout::preflight_connector::hosted_verdicts;

/// Namespaces rendered and dry-run at once: a 500-cluster preflight keeps the apiserver and the
/// blocking pool busy without crowding out the rollouts' own requests.
pub const NAMESPACES_AT_ONCE: usize = 8;

/// What one preflight is run on.
#[derive(Debug, Clone)]
pub struct PreflightJob {
    pub hcpkg: HostedClusterPackage,
    pub template: PackageTemplateSpec,
    pub run: PreflightRun,
    /// Each target HCP namespace with its HostedCluster's name and UID.
    pub targets: Vec<PreflightTarget>,
}

#[derive(Debug, Clone)]
pub struct PreflightTarget {
    pub namespace: String,
    pub hosted_cluster: String,
    pub hosted_cluster_uid: Option<String>,
}

/// Why a preflight did not finish; it is run again on the supervisor's next decision.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("reading the current ObjectDeployments: {0}")]
    Deployments(#[source] kube::Error),
    #[error("reading pull secrets or cluster facts: {0}")]
    Render(#[from] kube::Error),
    #[error("grouping the changes failed unexpectedly: {0}")]
    Grouping(String),
}

/// The ConfigMap a HostedClusterPackage's report is kept in: `preflight-<name>`, or, where that is
/// longer than a name may be, the name's start and a digest of all of it (two long names sharing a
/// start get two ConfigMaps, and the cut never leaves a name ending in `-` or `.`).
pub fn report_name(hcpkg: &str) -> String {
    const MAX: usize = 253;
    const DIGEST: usize = 10;
    let name = format!("preflight-{hcpkg}");
    if name.len() <= MAX {
        return name;
    }
    let digest = hex(&value_digest(&json!(hcpkg))[..DIGEST / 2]);
    // Names are ASCII (DNS subdomains), so bytes are characters.
    let start = name[..MAX - DIGEST - 1].trim_end_matches(['-', '.']);
    format!("{start}-{digest}")
}

/// Whether `config_map` is a report of the HostedClusterPackage named `hcpkg` (this one, or one of
/// that name deleted before it): only such a ConfigMap is written over.
fn is_report_of(config_map: &ConfigMap, hcpkg: &str) -> bool {
    let labelled = config_map
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HOSTED_CLUSTER_PACKAGE_LABEL))
        .is_some_and(|v| v == hcpkg);
    let owned = config_map
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| {
            o.kind == HostedClusterPackage::kind(&())
                && o.api_version == HostedClusterPackage::api_version(&())
                && o.name == hcpkg
        });
    labelled && owned
}

/// Runs the preflight of `job` and returns what the status keeps of it.
pub async fn run_preflight(
    context: ManagerContext,
    job: PreflightJob,
) -> Result<HostedClusterPackagePreflightStatus, PreflightError> {
    let name = job.hcpkg.metadata.name.clone().unwrap_or_default();
    let started = Instant::now();
    let settings = &context.rollouts.preflight;
    let pull = pull_package(&context, &job.template.spec.image);
    let files = match tokio::time::timeout(settings.pull_timeout, pull).await {
        Ok(pulled) => pulled.map_err(PreflightError::Render)?,
        Err(_) => Err(UnpackOutcome::PullFailed(format!(
            "no answer from the registry within {:?} (--preflight-pull-timeout)",
            settings.pull_timeout
        ))),
    };
    let current = Arc::new(current_deployments(&context, &name).await?);
    let shared = Arc::new((context.clone(), job.clone(), files));
    // Each namespace is reduced to its digest as it finishes (on the blocking pool), and only the
    // first namespace of each distinct change keeps its objects.
    let mut grouped = futures::stream::iter(job.targets.clone())
        .map(|target| {
            let (shared, current) = (shared.clone(), current.clone());
            async move {
                let (context, job, files) = &*shared;
                let outcome = match files {
                    Err(why) => Err(format!("the image cannot be had: {}", outcome_message(why))),
                    Ok(files) => {
                        namespace_preflight(context, job, &target, files.clone(), &current).await?
                    }
                };
                let ns = NamespacePreflight {
                    namespace: target.namespace.clone(),
                    hosted_cluster: Some(target.hosted_cluster.clone()),
                    outcome,
                };
                tokio::task::spawn_blocking(move || GroupedNamespace::of(&ns))
                    .await
                    .map_err(|e| PreflightError::Grouping(e.to_string()))
            }
        })
        .buffer_unordered(NAMESPACES_AT_ONCE);
    let mut groups = PreflightGroups::default();
    while let Some(namespace) = grouped.try_next().await? {
        groups.insert(namespace);
    }
    drop(grouped);
    let run = job.run.clone();
    let finished_at = stamp(Timestamp::now());
    let diff_deadline = Instant::now() + REPORT_DIFF_TIME;
    let report = tokio::task::spawn_blocking(move || {
        groups.report(
            &run.template_hash,
            &run.inputs_hash,
            &finished_at,
            diff_deadline,
        )
    })
    .await
    .map_err(|e| PreflightError::Grouping(e.to_string()))?;
    let namespace = context.rollouts.preflight.report_namespace.clone();
    let config_map = report_name(&name);
    // A report that cannot be kept leaves the verdicts standing: they hold or release the rollout.
    let kept = write_report(&context, &job.hcpkg, &namespace, &config_map, &report).await;
    let reference = format!("{namespace}/{config_map}");
    let mut status = preflight_status(&report, &reference, &job.run.request);
    if let Err(error) = kept {
        status.report = String::new();
        status.report_error = error.to_string();
    }
    context
        .metrics
        .rollouts
        .preflight
        .finished(&name, &status, started.elapsed().as_secs_f64());
    Ok(status)
}

/// Every ObjectDeployment named like the HostedClusterPackage (its Packages' deployments), by
/// namespace.
async fn current_deployments(
    context: &ManagerContext,
    name: &str,
) -> Result<BTreeMap<String, ObjectDeployment>, PreflightError> {
    let api: Api<ObjectDeployment> = Api::all(context.runtime.client.clone());
    let mut params = ListParams::default()
        .fields(&format!("metadata.name={name}"))
        .limit(200);
    let mut found = BTreeMap::new();
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(PreflightError::Deployments)?;
        for deployment in page.items {
            if let Some(ns) = deployment.metadata.namespace.clone() {
                found.insert(ns, deployment);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(found),
        }
    }
}

/// One namespace: its render, its changes and their verdicts, or why it could not be compared.
async fn namespace_preflight(
    context: &ManagerContext,
    job: &PreflightJob,
    target: &PreflightTarget,
    files: Arc<PackageFiles>,
    current: &BTreeMap<String, ObjectDeployment>,
) -> Result<Result<Vec<(ObjectChange, Verdict)>, String>, kube::Error> {
    let namespace = &target.namespace;
    let package: Package =
        match serde_json::from_value(desired_package(&job.hcpkg, &job.template, namespace)) {
            Ok(p) => p,
            Err(e) => return Ok(Err(format!("the Package cannot be made: {e}"))),
        };
    let package = PackageObject::from(package);
    let span = info_span!("preflight namespace", k8s.namespace.name = %namespace);
    let loaded = match render_package(context, &package, files)
        .instrument(span.clone())
        .await?
    {
        Ok(loaded) => loaded,
        Err(outcome) => {
            return Ok(Err(format!(
                "the release does not render: {}",
                outcome_message(&outcome)
            )))
        }
    };
    let rendered = phase_objects(&loaded.phases);
    let holds = match current.get(namespace) {
        Some(deployment) => {
            current_objects(context, namespace, &deployment.spec.template.spec.phases).await?
        }
        None => Vec::new(),
    };
    let changes = object_changes(&holds, &rendered);
    let introduced = Introduced::of(changes.iter().filter_map(|c| c.after.as_ref()));
    let mut checked = Vec::with_capacity(changes.len());
    let hosted: Vec<&ObjectChange> = changes.iter().filter(|c| c.hosted).collect();
    let cluster_uid = target.hosted_cluster_uid.as_deref();
    let mut remote = hosted_verdicts(context, namespace, cluster_uid, &hosted)
        .instrument(span.clone())
        .await
        .into_iter();
    for change in &changes {
        let verdict = if change.hosted {
            remote
                .next()
                .unwrap_or_else(|| Verdict::Unchecked("the connector gave no verdict".into()))
        } else {
            local_verdict(context, namespace, change, &introduced)
                .instrument(span.clone())
                .await
        };
        checked.push((change.clone(), verdict));
    }
    Ok(Ok(checked))
}

fn outcome_message(outcome: &UnpackOutcome) -> &str {
    match outcome {
        UnpackOutcome::Unpacked => "unpacked",
        UnpackOutcome::PullFailed(m)
        | UnpackOutcome::ImageRefused(m)
        | UnpackOutcome::Invalid(m) => m,
    }
}

fn phase_objects(phases: &[ObjectSetTemplatePhase]) -> Vec<PhaseObjects> {
    phases
        .iter()
        .map(|p| PhaseObjects {
            phase: p.name.clone(),
            hosted: p.class == HOSTED_CLUSTER_PHASE_CLASS,
            objects: p.objects.iter().map(|o| o.object.clone()).collect(),
        })
        .collect()
}

/// The objects the namespace's deployment holds, with its phases' slices read in.
async fn current_objects(
    context: &ManagerContext,
    namespace: &str,
    phases: &[ObjectSetTemplatePhase],
) -> Result<Vec<PhaseObjects>, kube::Error> {
    let mut objects = phase_objects(phases);
    let slices: Api<ObjectSlice> = Api::namespaced(context.runtime.client.clone(), namespace);
    for (phase, held) in phases.iter().zip(objects.iter_mut()) {
        for slice in &phase.slices {
            if let Some(slice) = slices.get_opt(slice).await? {
                held.objects
                    .extend(slice.objects.into_iter().map(|o| o.object));
            }
        }
    }
    Ok(objects)
}

/// The dry run of one change in the management cluster, as its phase would apply it (a delete is not
/// dry-run; an object the object engine refuses is refused here too).
async fn local_verdict(
    context: &ManagerContext,
    namespace: &str,
    change: &ObjectChange,
    introduced: &Introduced,
) -> Verdict {
    match as_applied(change, namespace) {
        None => Verdict::Unchecked("a delete is not dry-run".into()),
        Some(Err(refused)) => Verdict::Refused(refused.to_string()),
        Some(Ok(desired)) => {
            context.metrics.rollouts.preflight.dry_run();
            dry_run(&context.applier, &desired.key, &desired.object, introduced).await
        }
    }
}

/// Server-side applies the report as `report.json` of ConfigMap `namespace/name`, owned by the
/// HostedClusterPackage (it goes with it). Errors say which ConfigMap and why.
async fn write_report(
    context: &ManagerContext,
    hcpkg: &HostedClusterPackage,
    namespace: &str,
    name: &str,
    report: &pko_proto::core::rollout_preflight::PreflightReport,
) -> Result<(), String> {
    let text = serde_json::to_string(report).map_err(|e| format!("encoding the report: {e}"))?;
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {HOSTED_CLUSTER_PACKAGE_LABEL: hcpkg.metadata.name},
            "ownerReferences": [{
                "apiVersion": HostedClusterPackage::api_version(&()),
                "kind": HostedClusterPackage::kind(&()),
                "name": hcpkg.metadata.name,
                "uid": hcpkg.metadata.uid,
            }],
        },
        "data": {"report.json": text},
    });
    let api: Api<ConfigMap> = Api::namespaced(context.runtime.client.clone(), namespace);
    let hcpkg_name = hcpkg.metadata.name.as_deref().unwrap_or_default();
    let existing = api
        .get_opt(name)
        .await
        .map_err(|e| format!("reading ConfigMap {namespace}/{name}: {e}"))?;
    if existing.is_some_and(|cm| !is_report_of(&cm, hcpkg_name)) {
        return Err(format!(
            "ConfigMap {namespace}/{name} exists and is not a preflight report of \
             HostedClusterPackage {hcpkg_name}: left as it is, the report is not kept"
        ));
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("writing ConfigMap {namespace}/{name}: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_report_name_is_a_valid_name_of_its_own() {
        assert_eq!(report_name("addon"), "preflight-addon");
        let fits = "a".repeat(243);
        assert_eq!(report_name(&fits), format!("preflight-{fits}"));
        // Two long names with the same start, one cut right after a dot.
        let (one, other) = (
            format!("{}.x{}", "a".repeat(231), "b".repeat(30)),
            format!("{}.x{}", "a".repeat(231), "c".repeat(30)),
        );
        let (a, b) = (report_name(&one), report_name(&other));
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n.len() <= 253, "{}", n.len());
            assert!(n.starts_with("preflight-aaa"));
            let before_digest = &n[..n.len() - 11];
            assert!(!before_digest.ends_with(['-', '.']), "{n}");
        }
    }

    #[test]
    fn only_a_report_of_that_name_is_written_over() {
        let cm = |labels: Value, owners: Value| -> ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": "preflight-addon",
                "labels": labels, "ownerReferences": owners}}))
            .unwrap()
        };
        let owner = |name: &str, uid: &str| {
            json!([{"apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
                "name": name, "uid": uid}])
        };
        let label = json!({HOSTED_CLUSTER_PACKAGE_LABEL: "addon"});
        // Its own, or a deleted predecessor's of the same name.
        assert!(is_report_of(
            &cm(label.clone(), owner("addon", "u1")),
            "addon"
        ));
        assert!(is_report_of(
            &cm(label.clone(), owner("addon", "u0")),
            "addon"
        ));
        // Someone else's ConfigMap of that name, or another object's report.
        assert!(!is_report_of(&cm(json!({}), json!([])), "addon"));
        assert!(!is_report_of(&cm(label, owner("other", "u2")), "addon"));
        assert!(!is_report_of(&cm(json!({}), owner("addon", "u1")), "addon"));
    }
}
