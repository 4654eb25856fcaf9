//! `rollout approve`, `undo`, `pause` and `resume` of a HostedClusterPackage (pko's rollout policy). Each
//! is one merge patch carrying the resourceVersion it was decided on, so a change made meanwhile (a new
//! template, another approval) makes it fail instead of being overwritten.

use std::path::PathBuf;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::Api;
use pko_engine::api_time::stamp;
use pko_engine::fleet::promotion_gate::package_template_hash;
use pko_engine::rollout::rollout_decision::{annotations_approvals, undo_request};
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, RolloutApproval};
use pko_proto::well_known::{
    ROLLOUT_APPROVALS_ANNOTATION, ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION, ROLLOUT_UNDO_ANNOTATION,
};
use serde_json::{json, Value};

use crate::args::{Positionals, RolloutApproveArgs};
use crate::cluster::{client, resource_and_name};
use crate::rollout_follow::is_hosted_cluster_package;

async fn target(
    positionals: &Positionals,
    kubeconfig: Option<&PathBuf>,
    verb: &str,
) -> Result<(Api<HostedClusterPackage>, HostedClusterPackage, String), String> {
    let (res, name) = resource_and_name(&positionals.args)?;
    if !is_hosted_cluster_package(&res) {
        return Err(format!(
            "rollout {verb} takes a hostedclusterpackage, not {res:?}"
        ));
    }
    let api: Api<HostedClusterPackage> = Api::all(client(kubeconfig).await?);
    let hcpkg = api
        .get(&name)
        .await
        .map_err(|e| format!("hostedclusterpackage/{name}: {e}"))?;
    Ok((api, hcpkg, name))
}

async fn patch(
    api: &Api<HostedClusterPackage>,
    name: &str,
    hcpkg: &HostedClusterPackage,
    mut body: Value,
) -> Result<(), String> {
    body["metadata"]["resourceVersion"] = hcpkg.metadata.resource_version.clone().into();
    api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 => {
                format!("hostedclusterpackage/{name} changed meanwhile; look at it again and retry")
            }
            e => format!("hostedclusterpackage/{name}: {e}"),
        })
}

/// Who runs the command, as the kubeconfig names its user (recorded with an approval; the apiserver's
/// audit log holds the authenticated identity).
fn kubeconfig_user(kubeconfig: Option<&PathBuf>) -> String {
    let config = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    };
    config
        .ok()
        .and_then(|c| {
            let context = c.current_context.clone()?;
            c.contexts
                .iter()
                .find(|n| n.name == context)
                .and_then(|n| n.context.as_ref())
                .and_then(|ctx| ctx.user.clone())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The digest of the preflight of `hcpkg`'s template `hash`, checked against the one reviewed.
fn preflight_digest(
    hcpkg: &HostedClusterPackage,
    name: &str,
    hash: &str,
    reviewed: Option<&String>,
) -> Result<String, String> {
    let digest = hcpkg
        .status
        .as_ref()
        .and_then(|s| s.preflight.as_ref())
        .filter(|p| p.template_hash == hash)
        .map(|p| p.digest.clone())
        .ok_or_else(|| {
            format!(
                "the preflight of hostedclusterpackage/{name}'s template {hash} has not finished: \
                 review it with kubectl package rollout diff once it has"
            )
        })?;
    match reviewed {
        Some(reviewed) if *reviewed != digest => Err(format!(
            "the preflight of hostedclusterpackage/{name} now finds change {digest}, not {reviewed}: \
             review it with kubectl package rollout diff and approve again"
        )),
        _ => Ok(digest),
    }
}

/// `rollout approve hostedclusterpackage/NAME (--group G | --preflight) [--template-hash H]
/// [--preflight-digest D | --any-change]`.
pub async fn approve(
    args: &RolloutApproveArgs,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let (api, hcpkg, name) = target(&args.positionals, kubeconfig, "approve").await?;
    let hash = package_template_hash(&hcpkg.spec);
    if let Some(reviewed) = &args.template_hash {
        if *reviewed != hash {
            return Err(format!(
                "hostedclusterpackage/{name} now rolls out template {hash}, not {reviewed}: review it and approve again"
            ));
        }
    }
    let digest = if args.any_change {
        String::new()
    } else {
        preflight_digest(&hcpkg, &name, &hash, args.preflight_digest.as_ref())?
    };
    let approval = RolloutApproval {
        template_hash: hash.clone(),
        approved_by: kubeconfig_user(kubeconfig),
        approved_at: stamp(Timestamp::now()),
        preflight_digest: digest.clone(),
    };
    let Some(group) = &args.group else {
        let text = serde_json::to_string(&approval).map_err(|e| e.to_string())?;
        let annotations = json!({ ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION: text });
        patch(
            &api,
            &name,
            &hcpkg,
            json!({"metadata": {"annotations": annotations}}),
        )
        .await?;
        return Ok(format!(
            "hostedclusterpackage/{name}: the preflight's refusals accepted for template {hash}, change {digest}"
        ));
    };
    let groups: Vec<&str> = hcpkg
        .status
        .as_ref()
        .map(|s| s.partitions.iter().map(|p| p.name.as_str()).collect())
        .unwrap_or_default();
    if !groups.is_empty() && !groups.contains(&group.as_str()) {
        return Err(format!(
            "hostedclusterpackage/{name} has no group {group:?}; its groups: {}",
            groups.join(", ")
        ));
    }
    let mut approvals = annotations_approvals(&hcpkg);
    approvals.insert(group.clone(), approval);
    let text = serde_json::to_string(&approvals).map_err(|e| e.to_string())?;
    patch(
        &api,
        &name,
        &hcpkg,
        json!({"metadata": {"annotations": {ROLLOUT_APPROVALS_ANNOTATION: text}}}),
    )
    .await?;
    let change = if digest.is_empty() {
        "any change".to_owned()
    } else {
        format!("change {digest}")
    };
    Ok(format!(
        "hostedclusterpackage/{name}: group {group} approved for template {hash}, {change}"
    ))
}

/// `rollout undo hostedclusterpackage/NAME`: halt the current template and roll every Package back to
/// the last template that finished rolling out everywhere.
pub async fn undo(
    positionals: &Positionals,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let (api, hcpkg, name) = target(positionals, kubeconfig, "undo").await?;
    let hash = package_template_hash(&hcpkg.spec);
    let last = hcpkg
        .status
        .as_ref()
        .and_then(|s| s.last_succeeded.as_ref())
        .map(|l| l.template_hash.clone());
    match last {
        None => {
            return Err(format!(
                "hostedclusterpackage/{name}: no template finished rolling out everywhere yet, so there is nothing to roll back to"
            ))
        }
        Some(last) if last == hash => {
            return Err(format!(
                "hostedclusterpackage/{name}: template {hash} already finished rolling out everywhere; change the spec to roll out another"
            ))
        }
        Some(_) => {}
    }
    let generation = hcpkg.metadata.generation.unwrap_or_default();
    patch(
        &api,
        &name,
        &hcpkg,
        json!({"metadata": {"annotations": {ROLLOUT_UNDO_ANNOTATION: undo_request(&hash, generation)}}}),
    )
    .await?;
    Ok(format!(
        "hostedclusterpackage/{name}: rolling template {hash} back to {}",
        last.unwrap_or_default()
    ))
}

/// `rollout pause` / `rollout resume`: sets or clears `spec.paused`.
pub async fn set_rollout_paused(
    positionals: &Positionals,
    paused: bool,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let verb = if paused { "pause" } else { "resume" };
    let (api, hcpkg, name) = target(positionals, kubeconfig, verb).await?;
    let value = if paused {
        Value::Bool(true)
    } else {
        Value::Null
    };
    patch(&api, &name, &hcpkg, json!({"spec": {"paused": value}})).await?;
    Ok(format!(
        "hostedclusterpackage/{name} {}",
        if paused { "paused" } else { "resumed" }
    ))
}
