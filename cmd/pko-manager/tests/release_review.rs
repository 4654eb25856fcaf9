//! Knowing a release before it rolls (issue 43), on the real environment. The preflight: a release that
//! changes an immutable field in some HCP namespaces shows two groups of change, the refused one with
//! the apiserver's own message, and holds before its first group; an acceptance naming another digest
//! does not release it, one naming this change does; a release's hosted-cluster objects are dry-run in
//! the hosted cluster through the namespace's real connector. The simulator: on fleets drawn from a
//! seed, `kubectl package rollout simulate` predicts the order in which the real manager updates the
//! Packages, as its rollout event stream records it.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pko_actors::engine::fleet::promotion_gate::package_template_hash;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_proto::core::rollout_preflight::{HostedClusterPackagePreflightStatus, PreflightReport};
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION;
use pko_testenv::HOSTED_CLUSTERS_NAMESPACE;
use serde_json::{json, Value};

use common::packages::push;
use common::rollout::*;
use common::*;

fn log() -> String {
    manager().log_tail()
}

const LOCAL_MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata: {name: preflight-db}
spec:
  scopes: [Namespaced]
  phases: [{name: deploy}]
";

/// A StatefulSet whose claim size the release decides: `storage` is template text.
fn statefulset(storage: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
  annotations: {{package-operator.run/phase: deploy}}
spec:
  serviceName: db
  replicas: 0
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec: {{containers: [{{name: db, image: registry.invalid/db:1}}]}}
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: {storage}}}}}
"
    )
}

fn settings(release: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  annotations: {{package-operator.run/phase: deploy}}
data: {{release: {release}, namespace: '{{{{ .package.metadata.namespace }}}}'}}
"
    )
}

/// v1 everywhere the same; v2 bumps the ConfigMap and grows the claim of clusters labelled `db=big`
/// (an immutable field: the apiserver refuses it there).
async fn push_releases(tag: &str) -> (String, String) {
    let v1 = push(
        &format!("{tag}:v1"),
        &[
            ("manifest.yaml", LOCAL_MANIFEST),
            ("settings.yaml.gotmpl", &settings("v1")),
            ("db.yaml", &statefulset("1Gi")),
        ],
    )
    .await;
    let grown = "{{ if eq (index .environment.hyperShift.hostedCluster.metadata.labels \"db\") \"big\" }}2Gi{{ else }}1Gi{{ end }}";
    let v2 = push(
        &format!("{tag}:v2"),
        &[
            ("manifest.yaml", LOCAL_MANIFEST),
            ("settings.yaml.gotmpl", &settings("v2")),
            ("db.yaml.gotmpl", &statefulset(grown)),
        ],
    )
    .await;
    (v1, v2)
}

fn hcpkg_spec(name: &str, selector: Value, image: &str, extra: Value) -> HostedClusterPackage {
    let mut spec = json!({
        "hostedClusterSelector": {"matchLabels": selector},
        // Both Packages of a group at once: one of them fails where its change is refused.
        "strategy": {"rollingUpgrade": {"maxUnavailable": 2}},
        "template": {"spec": {"image": image}},
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// Sets label `key=value` on HostedCluster `namespace/name`.
async fn label(client: &Client, namespace: &str, name: &str, key: &str, value: &str) {
    let patch = json!({"metadata": {"labels": {key: value}}});
    Api::<HostedCluster>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn set_image(api: &Api<HostedClusterPackage>, name: &str, image: &str) -> String {
    let patch = json!({"spec": {"template": {"spec": {"image": image}}}});
    let h = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    package_template_hash(&h.spec)
}

fn preflight_of<'a>(
    h: &'a HostedClusterPackage,
    hash: &str,
) -> Option<&'a HostedClusterPackagePreflightStatus> {
    h.status
        .as_ref()?
        .preflight
        .as_ref()
        .filter(|p| p.template_hash == hash)
}

async fn report(client: &Client, status: &HostedClusterPackagePreflightStatus) -> PreflightReport {
    let (ns, name) = status.report.split_once('/').unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    serde_json::from_str(&cm.data.unwrap()["report.json"]).unwrap()
}

async fn image_of(client: &Client, namespace: &str, name: &str) -> String {
    Api::<Package>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap()
        .spec
        .image
}

#[tokio::test]
async fn an_immutable_change_is_refused_where_it_differs_and_holds_the_rollout_until_accepted() {
    manager();
    let client = env().management().client().await.unwrap();
    let risks = [Some("early"), Some("early"), Some("late"), Some("late")];
    let (fleet_ns, clusters) = fleet("preflight-local", &risks).await;
    // hc-00 and hc-02 get the bigger claim.
    for (i, cluster) in clusters.iter().enumerate() {
        let size = if i % 2 == 0 { "big" } else { "small" };
        label(&client, &fleet_ns, &cluster.name, "db", size).await;
    }
    let (v1, v2) = push_releases("preflight-db").await;
    let name = format!("{fleet_ns}-db");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let spec = hcpkg_spec(
        &name,
        json!({"fleet": fleet_ns}),
        &v1,
        json!({"partition": risk_partition()}),
    );
    api.create(&PostParams::default(), &spec).await.unwrap();
    let first = wait_status(&api, &name, log, "v1 everywhere", |h| all_available(h, 4)).await;
    assert!(
        first.status.unwrap().preflight.is_none(),
        "a first rollout creates Packages only: nothing to preflight"
    );

    let v2_hash = set_image(&api, &name, &v2).await;
    let held = wait_status(&api, &name, log, "the preflight of v2", |h| {
        preflight_of(h, &v2_hash).is_some()
    })
    .await;
    let status = held.status.clone().unwrap();
    let preflight = status.preflight.clone().unwrap();
    assert_eq!(
        (
            preflight.namespaces,
            preflight.changed,
            preflight.refused,
            preflight.unchecked
        ),
        (4, 4, 2, 0),
        "{preflight:#?}"
    );
    assert_eq!(preflight.groups.len(), 2, "{preflight:#?}");
    let refused_group = preflight.groups.iter().find(|g| g.refused).unwrap();
    assert_eq!(refused_group.namespaces, 2);
    assert!(
        refused_group
            .summary
            .contains("StatefulSet db: 1 field (requests.storage) — refused by the apiserver"),
        "{}",
        refused_group.summary
    );
    let refusal = &preflight.refusals[0];
    assert!(
        // 1.27 says `spec: Forbidden: updates to statefulset spec ...`, 1.37 `spec.volumeClaimTemplates:
        // Invalid value: ...`: both the apiserver's words about the set's spec.
        refusal
            .message
            .contains("StatefulSet.apps \"db\" is invalid: spec"),
        "the apiserver's own message: {refusal:?}"
    );
    let big: Vec<&String> = clusters
        .iter()
        .step_by(2)
        .map(|c| &c.hcp_namespace)
        .collect();
    assert!(
        big.contains(&&refusal.namespace),
        "{refusal:?} is not a db=big cluster"
    );

    // The full report: both groups, the refused one naming exactly the db=big namespaces.
    let full = report(&client, &preflight).await;
    assert_eq!(full.digest, preflight.digest);
    let refused = full
        .groups
        .iter()
        .find(|g| g.objects.iter().any(|o| o.verdict == "Refused"))
        .unwrap();
    let mut expected: Vec<String> = big.iter().map(|s| (*s).clone()).collect();
    expected.sort();
    assert_eq!(refused.namespaces, expected);
    let settings = &refused
        .objects
        .iter()
        .find(|o| o.object.contains("ConfigMap settings"))
        .unwrap();
    assert_eq!(settings.verdict, "Accepted");
    // The namespace's own name is written as a placeholder: that is why the two namespaces share it.
    for line in [
        "   namespace: $(namespace)\n",
        "-  release: v1\n+  release: v2\n",
    ] {
        assert!(
            settings.diff.contains(line),
            "{line:?} in {}",
            settings.diff
        );
    }

    // The rollout event stream tells it too, with the digest.
    let told = rollout_events(&name).await;
    assert!(
        told.iter().any(|e| e["kind"] == "preflightFinished"
            && e["message"].as_str().unwrap().contains(&format!(
                "2 refused, 0 unchecked; digest {}",
                preflight.digest
            ))),
        "{told:#?}"
    );

    // Held before the first group: nothing updated, the group says why.
    assert_eq!(status.partitions[0].state, "AwaitingPreflight");
    assert_eq!(status.counts.updated_packages, 0);
    let said = condition(&held, "Preflight").unwrap();
    assert_eq!(
        (said.status.as_str(), said.reason.as_str()),
        ("False", "Refused")
    );
    for cluster in &clusters {
        assert_eq!(image_of(&client, &cluster.hcp_namespace, &name).await, v1);
    }
    let shown = cli(&["rollout", "diff", &format!("hostedclusterpackage/{name}")]);
    assert!(
        shown.contains("4 namespaces in 2 groups: 4 change, 2 refused, 0 unchecked"),
        "{shown}"
    );
    for line in [
        "apps/v1 StatefulSet db · phase deploy (management cluster) · Update · Refused: StatefulSet.apps \"db\" is invalid",
        "-          storage: 1Gi\n+          storage: 2Gi\n",
    ] {
        assert!(shown.contains(line), "{line:?} in {shown}");
    }

    // The CLI refuses an acceptance of a change nobody reviewed here...
    let target = format!("hostedclusterpackage/{name}");
    let (ok, said) = run_cli(&[
        "rollout",
        "approve",
        &target,
        "--preflight",
        "--preflight-digest",
        "0000",
    ]);
    assert!(!ok && said.contains("now finds change"), "{said}");
    // ...and the manager does not let one through.
    let other = json!({"templateHash": v2_hash, "preflightDigest": "0000"}).to_string();
    let patch =
        json!({"metadata": {"annotations": {ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION: other}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_status(&api, &name, log, "the other digest seen", |h| {
        condition(h, "Preflight")
            .is_some_and(|c| c.message.contains("names digest 0000, not this change"))
    })
    .await;
    for cluster in &clusters {
        assert_eq!(
            image_of(&client, &cluster.hcp_namespace, &name).await,
            v1,
            "released by another digest"
        );
    }

    // Accepting this change releases the first group: its small cluster gets v2.
    cli(&[
        "rollout",
        "approve",
        &target,
        "--preflight",
        "--preflight-digest",
        &preflight.digest,
    ]);
    let small_early = &clusters[1].hcp_namespace;
    wait_until_image(&client, small_early, &name, &v2).await;
    let accepted = api.get(&name).await.unwrap();
    let said = condition(&accepted, "Preflight").unwrap();
    assert_eq!(
        (said.status.as_str(), said.reason.as_str()),
        ("True", "RefusalAccepted")
    );
}

/// The report's ConfigMap is written only over a report of the same HostedClusterPackage: a ConfigMap
/// of that name that someone else made in the manager's namespace is left as it is, and the status says
/// why the report is not kept, while the verdicts stand (issue 63, item 10). On the previous main the
/// report was force-applied over it.
#[tokio::test]
async fn a_foreign_config_map_of_the_reports_name_is_left_alone() {
    manager();
    let client = env().management().client().await.unwrap();
    let (fleet_ns, _clusters) = fleet("preflight-foreign", &[Some("early")]).await;
    let (v1, v2) = push_releases("preflight-foreign").await;
    let name = format!("{fleet_ns}-db");
    let report_ns = "package-operator-system";
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": report_ns}})).unwrap(),
        )
        .await;
    let foreign: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": format!("preflight-{name}"), "namespace": report_ns},
        "data": {"owner": "someone else"},
    }))
    .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), report_ns);
    config_maps
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let spec = hcpkg_spec(&name, json!({"fleet": fleet_ns}), &v1, json!({}));
    api.create(&PostParams::default(), &spec).await.unwrap();
    wait_status(&api, &name, log, "v1 everywhere", |h| all_available(h, 1)).await;
    let v2_hash = set_image(&api, &name, &v2).await;
    let h = wait_status(&api, &name, log, "the preflight of v2", |h| {
        preflight_of(h, &v2_hash).is_some()
    })
    .await;
    let preflight = preflight_of(&h, &v2_hash).unwrap();
    assert_eq!(preflight.report, "", "{preflight:#?}");
    assert!(
        preflight.report_error.contains(&format!(
            "ConfigMap {report_ns}/preflight-{name} exists and is not a preflight report"
        )),
        "{preflight:#?}"
    );
    assert_eq!(preflight.changed, 1, "the verdicts stand: {preflight:#?}");
    let after = config_maps.get(&format!("preflight-{name}")).await.unwrap();
    assert_eq!(
        after.data.unwrap().into_iter().collect::<Vec<_>>(),
        vec![("owner".to_owned(), "someone else".to_owned())]
    );
    assert!(after.metadata.owner_references.is_none());
}

async fn wait_until_image(client: &Client, namespace: &str, name: &str, image: &str) {
    pko_testenv::wait_until(
        &format!("{namespace}/{name} on {image}"),
        TIMEOUT,
        || async {
            let now = image_of(client, namespace, name).await;
            if now == image {
                Ok(())
            } else {
                Err(now)
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nmanager log:\n{}", log()));
}

const HOSTED_MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata: {name: preflight-hosted}
spec:
  scopes: [Namespaced]
  phases: [{name: hosted, class: hosted-cluster}]
";

/// A ConfigMap and an immutable Secret in the hosted cluster, both carrying `release`.
fn hosted_objects(release: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: preflight-settings
  namespace: default
  annotations: {{package-operator.run/phase: hosted}}
data: {{release: {release}}}
---
apiVersion: v1
kind: Secret
metadata:
  name: preflight-token
  namespace: default
  annotations: {{package-operator.run/phase: hosted}}
immutable: true
stringData: {{token: {token}}}
"
    )
}

#[tokio::test]
async fn hosted_cluster_objects_are_dry_run_in_the_hosted_cluster_through_its_connector() {
    manager();
    let env = env();
    let client = env.management().client().await.unwrap();
    let clusters = env.simulate_hypershift().await.unwrap();
    let _runner = env
        .start_connector_runner(&connector_binary())
        .await
        .unwrap();
    let cluster = &clusters[0];
    label(
        &client,
        HOSTED_CLUSTERS_NAMESPACE,
        &cluster.name,
        "preflight-hosted",
        "yes",
    )
    .await;
    let v1 = push(
        "preflight-hosted:v1",
        &[
            ("manifest.yaml", HOSTED_MANIFEST),
            ("hosted.yaml", &hosted_objects("v1", "first-token-value")),
        ],
    )
    .await;
    let v2 = push(
        "preflight-hosted:v2",
        &[
            ("manifest.yaml", HOSTED_MANIFEST),
            ("hosted.yaml", &hosted_objects("v2", "second-token-value")),
        ],
    )
    .await;
    let name = "preflight-hosted";
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let spec = hcpkg_spec(name, json!({"preflight-hosted": "yes"}), &v1, json!({}));
    api.create(&PostParams::default(), &spec).await.unwrap();
    wait_status(&api, name, log, "v1 in the hosted cluster", |h| {
        all_available(h, 1)
    })
    .await;

    let v2_hash = set_image(&api, name, &v2).await;
    let h = wait_status(&api, name, log, "the preflight of v2", |h| {
        preflight_of(h, &v2_hash).is_some()
    })
    .await;
    let preflight = preflight_of(&h, &v2_hash).unwrap().clone();
    assert_eq!(
        (preflight.changed, preflight.refused),
        (1, 1),
        "{preflight:#?}"
    );
    let full = report(&client, &preflight).await;
    let objects = &full.groups[0].objects;
    let by_kind: BTreeMap<&str, &pko_proto::core::rollout_preflight::PreflightObjectChange> =
        objects
            .iter()
            .map(|o| (o.object.split(' ').nth(1).unwrap(), o))
            .collect();
    let (config, secret) = (by_kind["ConfigMap"], by_kind["Secret"]);
    assert!(config.hosted && secret.hosted);
    assert_eq!(config.verdict, "Accepted", "{config:?}");
    assert_eq!(secret.verdict, "Refused", "{secret:?}");
    assert!(
        secret.message.contains("immutable"),
        "the hosted apiserver's own message: {secret:?}"
    );
    for shown in [&secret.diff, &serde_json::to_string(&full).unwrap()] {
        assert!(
            !shown.contains("second-token-value") && !shown.contains("first-token-value"),
            "{shown}"
        );
    }
    // Nothing was written there: the hosted ConfigMap still holds v1.
    let hosted_client = env.hosted_clusters()[0].client().await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(hosted_client, "default")
        .get("preflight-settings")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["release"], "v1");
}

const CONFIG_MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata: {name: simulated}
spec:
  scopes: [Namespaced]
  phases: [{name: deploy}]
";

fn config(release: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: simulated
  annotations: {{package-operator.run/phase: deploy}}
data: {{release: {release}}}
"
    )
}

/// xorshift64: fleets drawn from a seed, named in every failure.
fn draw(state: &mut u64, below: u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state % below
}

/// The Packages the simulator says the next release updates, in order.
fn predicted_updates(simulation: &Value) -> Vec<String> {
    simulation["waves"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["rollback"] == false)
        .flat_map(|w| w["updated"].as_array().unwrap().iter())
        .map(|ns| ns.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_simulator_predicts_the_order_the_manager_updates_in() {
    manager();
    let client = env().management().client().await.unwrap();
    let v1 = push(
        "simulated:v1",
        &[
            ("manifest.yaml", CONFIG_MANIFEST),
            ("cm.yaml", &config("v1")),
        ],
    )
    .await;
    let v2 = push(
        "simulated:v2",
        &[
            ("manifest.yaml", CONFIG_MANIFEST),
            ("cm.yaml", &config("v2")),
        ],
    )
    .await;
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    for seed in [0x5eed_0001_u64, 0x5eed_0002, 0x5eed_0003] {
        let mut state = seed;
        let mut risks = Vec::new();
        for group in ["early", "normal", "late"] {
            for _ in 0..=draw(&mut state, 3) {
                risks.push(Some(group));
            }
        }
        let max = 1 + draw(&mut state, 3);
        let (fleet_ns, _) = fleet(&format!("simulate-{seed:x}"), &risks).await;
        let name = format!("{fleet_ns}-sim");
        let spec = hcpkg_spec(
            &name,
            json!({"fleet": fleet_ns}),
            &v1,
            json!({"partition": risk_partition(), "strategy": {"rollingUpgrade": {"maxUnavailable": max}}}),
        );
        api.create(&PostParams::default(), &spec).await.unwrap();
        let total = risks.len() as i32;
        wait_status(&api, &name, log, "v1 everywhere", |h| {
            all_available(h, total)
        })
        .await;

        // At rest: the simulator runs the next release, from the cluster and from a saved fleet.
        let target = format!("hostedclusterpackage/{name}");
        let simulate = |extra: &[&str]| {
            let mut args = vec![
                "rollout",
                "simulate",
                target.as_str(),
                "--readiness",
                "1s",
                "-o",
                "json",
            ];
            args.extend_from_slice(extra);
            serde_json::from_str::<Value>(&cli(&args)).unwrap()
        };
        let live = simulate(&[]);
        let saved = env().root_dir().join(format!("{name}.json"));
        let said = cli(&[
            "rollout",
            "simulate",
            &target,
            "--save",
            saved.to_str().unwrap(),
        ]);
        assert!(
            said.contains(&format!(
                "{total} HostedClusters and {total} Packages saved"
            )),
            "{said}"
        );
        assert_eq!(simulate(&["--snapshot", saved.to_str().unwrap()]), live);
        assert_eq!(live["ending"]["kind"], "Finished", "seed {seed:x}: {live}");
        assert!(
            live["peakUnavailable"].as_u64().unwrap() <= max,
            "seed {seed:x}: {live}"
        );
        let predicted = predicted_updates(&live);

        set_image(&api, &name, &v2).await;
        let rolled = wait_status(&api, &name, log, "v2 everywhere", |h| {
            all_available(h, total)
                && h.status
                    .as_ref()
                    .unwrap()
                    .last_succeeded
                    .as_ref()
                    .is_some_and(|l| l.template_hash == package_template_hash(&h.spec))
        })
        .await;
        let generation = rolled.metadata.generation.unwrap();
        let told: Vec<String> = rollout_events(&name)
            .await
            .into_iter()
            .filter(|e| e["kind"] == "packageUpdated" && e["generation"] == generation)
            .map(|e| e["namespace"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            told, predicted,
            "seed {seed:x} ({risks:?}, maxUnavailable {max}): the manager's updates against the simulation"
        );
    }
}
