//! `rollout diff hostedclusterpackage/NAME [-o json] [--refresh]`: what a release changes where, as the
//! manager's preflight found it: HCP namespaces grouped by identical change, each group's objects with
//! their unified diffs and the apiserver's dry-run verdicts. The status keeps the counts and digests;
//! the full report is read from the ConfigMap the status names.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::Api;
use pko_engine::api_time::stamp;
use pko_engine::fleet::promotion_gate::package_template_hash;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::rollout_preflight::{HostedClusterPackagePreflightStatus, PreflightReport};
use pko_proto::well_known::ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION;
use serde_json::json;

use crate::args::RolloutDiffArgs;
use crate::cluster::{client, resource_and_name};
use crate::rollout_follow::is_hosted_cluster_package;

/// Namespaces listed per group in the text output (`-o json` has all).
const LISTED_NAMESPACES: usize = 20;

pub async fn diff(args: &RolloutDiffArgs, kubeconfig: Option<&PathBuf>) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    if !is_hosted_cluster_package(&res) {
        return Err(format!(
            "rollout diff takes a hostedclusterpackage, not {res:?}"
        ));
    }
    if !matches!(args.output.as_str(), "" | "json") {
        return Err(format!("unknown output {:?}: want json", args.output));
    }
    let client = client(kubeconfig).await?;
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let read = |e: kube::Error| format!("hostedclusterpackage/{name}: {e}");
    let mut hcpkg = api.get(&name).await.map_err(read)?;
    if args.refresh {
        hcpkg = refresh(&api, &name, &args.timeout).await?;
    }
    let current = package_template_hash(&hcpkg.spec);
    let status = hcpkg
        .status
        .as_ref()
        .and_then(|s| s.preflight.clone())
        .ok_or_else(|| {
            format!(
                "hostedclusterpackage/{name} has no preflight yet: one runs when its template changes while \
                 Packages are to be updated, or ask for one with --refresh"
            )
        })?;
    let report = read_report(&client, &status).await?;
    if args.output == "json" {
        return serde_json::to_string_pretty(&report).map_err(|e| e.to_string());
    }
    Ok(report_text(&name, &current, &status, &report))
}

/// Asks for a new preflight and waits until the status answers it.
async fn refresh(
    api: &Api<HostedClusterPackage>,
    name: &str,
    timeout: &str,
) -> Result<HostedClusterPackage, String> {
    let limit = pko_engine::rollout::rollout_policy::parse_duration(timeout).ok_or_else(|| {
        format!("invalid --timeout {timeout:?}: want a duration such as 30s or 5m")
    })?;
    let request = stamp(Timestamp::now());
    let body =
        json!({"metadata": {"annotations": {ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION: request}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|e| format!("hostedclusterpackage/{name}: {e}"))?;
    let started = Instant::now();
    loop {
        let hcpkg = api
            .get(name)
            .await
            .map_err(|e| format!("hostedclusterpackage/{name}: {e}"))?;
        let answered = hcpkg
            .status
            .as_ref()
            .and_then(|s| s.preflight.as_ref())
            .is_some_and(|p| p.request == request);
        if answered {
            return Ok(hcpkg);
        }
        if started.elapsed() >= limit {
            return Err(format!(
                "hostedclusterpackage/{name}: no preflight answered the request within {timeout}"
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The report the status names (`<namespace>/<name>` of a ConfigMap, key `report.json`).
async fn read_report(
    client: &kube::Client,
    status: &HostedClusterPackagePreflightStatus,
) -> Result<PreflightReport, String> {
    if !status.report_error.is_empty() {
        return Err(format!(
            "the manager could not keep the full report: {}",
            status.report_error
        ));
    }
    let (namespace, name) = status
        .report
        .split_once('/')
        .ok_or_else(|| format!("the status names no report ConfigMap ({:?})", status.report))?;
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("the preflight report {}: {e}", status.report))?;
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get("report.json"))
        .ok_or_else(|| format!("the preflight report {} has no report.json", status.report))?;
    serde_json::from_str(text).map_err(|e| format!("the preflight report {}: {e}", status.report))
}

/// The report as text: a heading with the counts, then each group with its namespaces, its objects'
/// verdicts and their diffs.
pub fn report_text(
    name: &str,
    current: &str,
    status: &HostedClusterPackagePreflightStatus,
    report: &PreflightReport,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "hostedclusterpackage/{name}: preflight of template {}, digest {}, finished {}",
        report.template_hash, report.digest, report.finished_at
    );
    if report.template_hash != current {
        let _ = writeln!(
            out,
            "The current template is {current}: its preflight has not finished; this is the last one."
        );
    }
    if report.digest != status.digest {
        let _ = writeln!(
            out,
            "The status names digest {}: the report was written since, and the status follows.",
            status.digest
        );
    }
    let namespaces: usize = report.groups.iter().map(|g| g.namespaces.len()).sum();
    let _ = writeln!(
        out,
        "{namespaces} namespaces in {} groups: {} change, {} refused, {} unchecked",
        report.groups.len(),
        status.changed,
        status.refused,
        status.unchecked
    );
    for (i, group) in report.groups.iter().enumerate() {
        let _ = writeln!(
            out,
            "\nGroup {} of {}: {} namespaces, digest {}",
            i + 1,
            report.groups.len(),
            group.namespaces.len(),
            group.digest
        );
        let listed: Vec<&str> = group
            .namespaces
            .iter()
            .take(LISTED_NAMESPACES)
            .map(String::as_str)
            .collect();
        let more = group.namespaces.len().saturating_sub(LISTED_NAMESPACES);
        let tail = if more > 0 {
            format!(" and {more} more (-o json lists all)")
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {}{tail}", listed.join(", "));
        let _ = writeln!(out, "  {}", group.summary);
        if let Some(why) = &group.unchecked {
            let _ = writeln!(out, "  not compared: {why}");
        }
        for object in &group.objects {
            let place = if object.hosted {
                "hosted cluster"
            } else {
                "management cluster"
            };
            let verdict = match object.message.as_str() {
                "" => object.verdict.clone(),
                message => format!("{}: {message}", object.verdict),
            };
            let _ = writeln!(
                out,
                "\n  {} · phase {} ({place}) · {} · {verdict}",
                object.object, object.phase, object.action
            );
            if !object.fields.is_empty() {
                let _ = writeln!(out, "  fields: {}", object.fields.join(", "));
            }
            out.push_str(&object.diff);
        }
    }
    if let Some(truncated) = &report.truncated {
        let _ = writeln!(out, "\n{truncated}");
    }
    out
}
