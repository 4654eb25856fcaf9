//! The commands that talk to a cluster, as upstream's behave: `rollout history` lists the revisions
//! (ObjectSets) of a (Cluster)Package or (Cluster)ObjectDeployment, `clustertree` prints the phases and
//! objects of an installed package's available revision, `pause`/`unpause` set `spec.paused` on a
//! (Cluster)Package and wait for it to take effect.

use pko_proto::well_known::{INSTANCE_LABEL, PAUSE_MESSAGE_ANNOTATION};
use std::path::PathBuf;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use pko_proto::core::object_deployment::{ClusterObjectDeployment, ObjectDeployment};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet};
use pko_proto::core::package::{ClusterPackage, Package};
use serde_json::Value;

use crate::args::{ClusterTreeArgs, HistoryArgs, PauseArgs};

/// Cluster access: `--kubeconfig`, `$KUBECONFIG`, the in-cluster account, `~/.kube/config`.
pub(crate) async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| e.to_string())?
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    Client::try_from(config).map_err(|e| e.to_string())
}

pub(crate) fn api(client: Client, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    if namespace.is_empty() {
        Api::all_with(client, resource)
    } else {
        Api::namespaced_with(client, namespace, resource)
    }
}

/// `RES NAME` or `RES/NAME`.
pub(crate) fn resource_and_name(args: &[String]) -> Result<(String, String), String> {
    match args {
        [res, name] => Ok((res.to_lowercase(), name.clone())),
        [both] => match both.split_once('/') {
            Some((res, name)) if !res.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok((res.to_lowercase(), name.to_owned()))
            }
            _ => Err("arguments invalid: arguments in resource/name form must have a single resource and name".to_owned()),
        },
        _ => Err("arguments invalid: arguments in resource/name form must have a single resource and name".to_owned()),
    }
}

/// A kind whose revisions are ObjectSets, and where to read it.
pub(crate) struct RevisionedKind {
    pub owner: ApiResource,
    pub revisions: ApiResource,
    /// Empty for the cluster-scoped kinds.
    pub namespace: String,
}

/// What `res` (`package`, `objectdeployment`, or their `cluster…` kinds) names in `namespace`. Upstream's
/// quirk, kept: without a namespace the cluster-scoped kind is read.
pub(crate) fn revisioned_kind(res: &str, namespace: &str) -> Option<RevisionedKind> {
    let cluster = res.starts_with("cluster") || namespace.is_empty();
    let (owner, revisions) = match (res.trim_start_matches("cluster"), cluster) {
        ("package", false) => (
            ApiResource::erase::<Package>(&()),
            ApiResource::erase::<ObjectSet>(&()),
        ),
        ("package", true) => (
            ApiResource::erase::<ClusterPackage>(&()),
            ApiResource::erase::<ClusterObjectSet>(&()),
        ),
        ("objectdeployment", false) => (
            ApiResource::erase::<ObjectDeployment>(&()),
            ApiResource::erase::<ObjectSet>(&()),
        ),
        ("objectdeployment", true) => (
            ApiResource::erase::<ClusterObjectDeployment>(&()),
            ApiResource::erase::<ClusterObjectSet>(&()),
        ),
        _ => return None,
    };
    Some(RevisionedKind {
        owner,
        revisions,
        namespace: if cluster {
            String::new()
        } else {
            namespace.to_owned()
        },
    })
}

/// `rollout history`: the table, YAML or JSON.
pub async fn history(args: &HistoryArgs, kubeconfig: Option<&PathBuf>) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    let output = args.output.to_lowercase();
    if !matches!(output.as_str(), "" | "json" | "yaml") {
        return Err(format!("invalid output format: {:?}", args.output));
    }
    let RevisionedKind {
        owner: kind,
        revisions: set_kind,
        namespace,
    } = revisioned_kind(&res, &args.namespace).ok_or("invalid resource type")?;
    let client = client(kubeconfig).await?;
    let owner = api(client.clone(), &kind, &namespace)
        .get(&name)
        .await
        .map_err(|e| format!("getting resource {res}/{name}: getting package object: {e}"))?;
    let selector = if res.contains("package") {
        format!("{INSTANCE_LABEL}={name}")
    } else {
        owner
            .metadata
            .labels
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut sets = api(client, &set_kind, &namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing revisions of {res}/{name}: {e}"))?
        .items;
    sets.sort_by_key(revision_of);
    let render_one = |set: &DynamicObject| -> Result<String, String> {
        if output == "json" {
            serde_json::to_value(set)
                .map_err(|e| e.to_string())
                .map(|v| format!("{}\n", json_indent4(&v)))
        } else {
            serde_saphyr::to_string(set).map_err(|e| e.to_string())
        }
    };
    if args.revision > 0 {
        let set = sets
            .iter()
            .find(|s| revision_of(s) == args.revision)
            .ok_or("revision not found")?;
        return render_one(set);
    }
    match output.as_str() {
        "json" => {
            let list = serde_json::to_value(&sets).map_err(|e| e.to_string())?;
            Ok(format!("{}\n", json_indent4(&list)))
        }
        "yaml" => serde_saphyr::to_string(&sets).map_err(|e| e.to_string()),
        _ => Ok(history_table(&sets)),
    }
}

fn revision_of(set: &DynamicObject) -> i64 {
    set.data
        .pointer("/spec/revision")
        .or_else(|| set.data.pointer("/status/revision"))
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

fn condition_status<'a>(object: &'a Value, kind: &str) -> Option<&'a str> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?
        .get("status")?
        .as_str()
}

/// REVISION, SUCCESSFUL, CHANGE-CAUSE: left-aligned, padded to the column width (the last too), two
/// spaces between columns, one empty line after.
pub fn history_table(sets: &[DynamicObject]) -> String {
    let mut rows = vec![[
        "REVISION".to_owned(),
        "SUCCESSFUL".to_owned(),
        "CHANGE-CAUSE".to_owned(),
    ]];
    for set in sets {
        let cause = set
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/change-cause"))
            .cloned()
            .unwrap_or_default();
        let successful = condition_status(&set.data, "Succeeded") == Some("True");
        rows.push([revision_of(set).to_string(), successful.to_string(), cause]);
    }
    let widths: Vec<usize> = (0..3)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(&cells.join("  "));
        out.push('\n');
    }
    out.push('\n');
    out
}

/// JSON indented with four spaces, as Go's `json.MarshalIndent(v, "", "    ")`.
fn json_indent4(value: &Value) -> String {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    if serde::Serialize::serialize(value, &mut ser).is_err() {
        return value.to_string();
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// `clustertree`: the phases and objects of the package's available ObjectSet.
pub async fn cluster_tree(
    args: &ClusterTreeArgs,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    let (header, set_kind, namespace, missing) = match res.as_str() {
        "clusterpackage" => (
            format!("ClusterPackage /{name}\n"),
            ApiResource::erase::<ClusterObjectSet>(&()),
            String::new(),
            "ClusterObjectSet could not be found",
        ),
        "package" => {
            if args.namespace.is_empty() {
                return Err("--namespace is required as its a namespaced Resource type".to_owned());
            }
            (
                format!("Package /{name}\nnamespace/{}\n", args.namespace),
                ApiResource::erase::<ObjectSet>(&()),
                args.namespace.clone(),
                "ObjectSet could not be found",
            )
        }
        _ => return Err("invalid resource type".to_owned()),
    };
    let client = client(kubeconfig).await?;
    let sets = api(client, &set_kind, &namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let set = sets
        .iter()
        .find(|s| {
            s.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains(&name))
                && condition_status(&s.data, "Available") == Some("True")
        })
        .ok_or(missing)?;
    // Every phase of the revision, empty ones too, as upstream prints them.
    let phases: Vec<(&str, Vec<&Value>)> = set
        .data
        .pointer("/spec/phases")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|phase| {
            let objects = phase["objects"].as_array().into_iter().flatten();
            (
                phase["name"].as_str().unwrap_or_default(),
                objects.map(|o| &o["object"]).collect(),
            )
        })
        .collect();
    let out = header + &crate::tree::phase_lines(&phases);
    Ok(out)
}

/// `pause`/`unpause`: sets `spec.paused` (and the pause message) with a full update, then waits up to a
/// minute for Paused=True (pause) or Available=True (unpause). Prints nothing on success.
pub async fn set_paused(
    args: &PauseArgs,
    paused: bool,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    let (resource, namespace) = match res.as_str() {
        "package" => (ApiResource::erase::<Package>(&()), args.namespace.as_str()),
        "clusterpackage" => (ApiResource::erase::<ClusterPackage>(&()), ""),
        other => {
            return Err(format!(
                "invalid resource name: expected `clusterpackage`/`package`, got `{other}`"
            ))
        }
    };
    let verb = if paused { "pausing" } else { "unpausing" };
    let failed = |e: &dyn std::fmt::Display| format!("{verb} package: {e}");
    let client = client(kubeconfig).await.map_err(|e| failed(&e))?;
    let packages = api(client, &resource, namespace);
    let mut package = packages.get(&name).await.map_err(|e| failed(&e))?;
    package.data["spec"]["paused"] = Value::Bool(paused);
    let annotations = package
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if paused {
        annotations.insert(PAUSE_MESSAGE_ANNOTATION.to_owned(), args.message.clone());
    } else {
        annotations.remove(PAUSE_MESSAGE_ANNOTATION);
    }
    packages
        .replace(&name, &PostParams::default(), &package)
        .await
        .map_err(|e| failed(&e))?;
    let wanted = if paused { "Paused" } else { "Available" };
    for _ in 0..60 {
        let current = packages.get(&name).await.map_err(|e| failed(&e))?;
        if condition_status(&current.data, wanted) == Some("True") {
            return Ok(String::new());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(failed(&format!(
        "timed out waiting for {wanted}=True on {res}/{name}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_table_is_padded_like_upstream() {
        let set = |revision: i64, succeeded: &str, cause: Option<&str>| {
            let mut o: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
                "metadata": {"name": format!("s{revision}")},
                "status": {"revision": revision, "conditions": [{"type": "Succeeded", "status": succeeded}]},
            }))
            .unwrap();
            if let Some(c) = cause {
                o.metadata.annotations =
                    Some([("kubernetes.io/change-cause".to_owned(), c.to_owned())].into());
            }
            o
        };
        assert_eq!(
            history_table(&[set(1, "True", Some("first")), set(2, "False", None)]),
            "REVISION  SUCCESSFUL  CHANGE-CAUSE\n1         true        first       \n2         false                   \n\n"
        );
    }

    #[test]
    fn resources_come_as_two_args_or_res_slash_name() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            resource_and_name(&v(&["Package", "x"])).unwrap(),
            ("package".to_owned(), "x".to_owned())
        );
        assert_eq!(
            resource_and_name(&v(&["package/x"])).unwrap(),
            ("package".to_owned(), "x".to_owned())
        );
        assert_eq!(
            resource_and_name(&v(&["package"])).unwrap_err(),
            "arguments invalid: arguments in resource/name form must have a single resource and name"
        );
    }
}
