//! The example packages of `cmd/kubectl-package/tests/packages`, built and pushed with the real
//! `kubectl-package build --push`, installed as Package and ClusterPackage on the real apiserver: each
//! becomes Available with the objects its templates and config give.
//!
//! `kubectl-package` is found next to the manager binary; `cargo test --workspace` builds both.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::Api;
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet};
use pko_testenv::wait_until;
use serde_json::{json, Value};

use common::*;

/// Waits until the (Cluster)Package's Available condition is True for its current generation.
async fn wait_available(client: &kube::Client, ns: Option<&str>, name: &str) {
    let api = package_api(client, ns);
    let waited = wait_until(&format!("package {name} Available"), TIMEOUT, || async {
        let p = api.get(name).await.map_err(|e| e.to_string())?;
        if current_condition(&p, "Available", "True").is_some() {
            return Ok(());
        }
        let conditions = p.data.pointer("/status/conditions").cloned();
        // Say why: the package's conditions and its ObjectSets' conditions.
        let sets = match ns {
            Some(ns) => Api::<DynamicObject>::namespaced_with(
                client.clone(),
                ns,
                &ApiResource::erase::<ObjectSet>(&()),
            ),
            None => Api::all_with(client.clone(), &ApiResource::erase::<ClusterObjectSet>(&())),
        };
        let sets: Vec<Value> = sets
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(name))
            })
            .map(|s| {
                s.data
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        Err(format!("package: {conditions:?}; sets: {sets:?}"))
    })
    .await;
    if let Err(error) = waited {
        // A set stuck on a Deployment probe: tell "the controller never wrote its status" from "pko
        // did not see it" with what the apiserver holds now.
        let deployments: Vec<String> = Api::<Deployment>::all(client.clone())
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.metadata.name.as_deref() == Some(name))
            .map(|d| format!("{:?}: {:?}", d.metadata.namespace, d.status))
            .collect();
        panic!(
            "{error}\nDeployments {name} now: {deployments:?}\nmanager log:\n{}",
            manager().log_tail()
        );
    }
}

async fn deployment(client: &kube::Client, ns: &str, name: &str) -> Deployment {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn simple_package_installs_in_both_scopes() {
    let (client, ns) = setup("ex-simple").await;
    let image = build_and_push("simple", "simple:v1");
    // No kubelet here: with 0 replicas the Deployment is Available, which the package probes.
    install(&client, Some(&ns), "simple", &image, json!({"replicas": 0})).await;
    let cluster_name = format!("{ns}-simple");
    install(&client, None, &cluster_name, &image, json!({"replicas": 0})).await;

    wait_available(&client, Some(&ns), "simple").await;
    let d = deployment(&client, &ns, "simple").await;
    assert_eq!(d.spec.unwrap().replicas, Some(0));
    let cm = get_cm(&client, &ns, "simple-settings").await.unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data["replicas"], "0");
    assert_eq!(data["motd"], "welcome to simple");
    assert_eq!(data["scale"], "low");

    wait_available(&client, None, &cluster_name).await;
    let cluster_ns = format!("{cluster_name}-ns");
    let namespace = Api::<Namespace>::all(client.clone())
        .get(&cluster_ns)
        .await
        .unwrap();
    assert!(namespace.metadata.owner_references.is_some());
    let d = deployment(&client, &cluster_ns, &cluster_name).await;
    assert_eq!(
        d.metadata.labels.unwrap()["app.kubernetes.io/name"],
        cluster_name
    );
}

#[tokio::test]
async fn handlebars_package_renders_and_hands_over_on_update() {
    let (client, ns) = setup("ex-hbs").await;
    let image = build_and_push("handlebars", "handlebars:v1");
    install(&client, Some(&ns), "hb", &image, json!({"greeting": "hi"})).await;
    wait_available(&client, Some(&ns), "hb").await;

    let settings = get_cm(&client, &ns, "hb-settings").await.unwrap();
    let data = settings.data.unwrap();
    assert_eq!(data["greeting"], "HI");
    assert_eq!(data["regions"], "eu,us");
    // The apiserver's own version, as the template reads it.
    let version = client.apiserver_version().await.unwrap().git_version;
    assert_eq!(data["kubernetes"], version, "{data:?}");
    assert_eq!(
        settings.metadata.labels.unwrap()["app.kubernetes.io/managed-by"],
        "pko"
    );
    let eu = get_cm(&client, &ns, "hb-region-eu").await.unwrap();
    assert_eq!(eu.data.as_ref().unwrap()["index"], "0");
    assert!(get_cm(&client, &ns, "hb-region-us").await.is_some());

    // A config update rolls a new revision: the kept object is handed over (same object), the dropped
    // one is removed.
    package_api(&client, Some(&ns))
        .patch(
            "hb",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"config": {"regions": ["eu"]}}})),
        )
        .await
        .unwrap();
    wait_cm_gone(&client, &ns, "hb-region-us").await;
    wait_available(&client, Some(&ns), "hb").await;
    let eu_after = get_cm(&client, &ns, "hb-region-eu").await.unwrap();
    assert_eq!(eu_after.metadata.uid, eu.metadata.uid);
    let settings = get_cm(&client, &ns, "hb-settings").await.unwrap();
    assert_eq!(settings.data.unwrap()["regions"], "eu");

    // Upstream's cluster commands: `rollout history` lists both revisions, `clustertree` shows the live
    // one, `pause`/`unpause` flip spec.paused and wait for the package to follow.
    let kubeconfig = env().management().kubeconfig_path().display().to_string();
    let cli = |args: &[&str]| {
        let out = Command::new(kubectl_package())
            .args(args)
            .args(["-n", &ns, "--kubeconfig", &kubeconfig])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let history = wait_until("revision 2 succeeded", TIMEOUT, || async {
        match cli(&["rollout", "history", "package", "hb"]) {
            (Some(0), out, _)
                if out
                    .lines()
                    .nth(2)
                    .is_some_and(|l| l.starts_with("2 ") && l.contains("true")) =>
            {
                Ok(out)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines[0], "REVISION  SUCCESSFUL  CHANGE-CAUSE", "{history}");
    assert!(lines[1].starts_with("1         "), "{history}");
    assert_eq!(lines.len(), 4, "{history}");
    assert!(history.ends_with("\n\n"), "{history:?}");
    let (code, json_out, _) = cli(&["rollout", "history", "package/hb", "-o", "JSON"]);
    assert_eq!(code, Some(0));
    let sets: Vec<Value> = serde_json::from_str(&json_out).unwrap();
    assert_eq!(sets.len(), 2);
    assert!(
        json_out.starts_with("[\n    {"),
        "indented with four spaces: {json_out}"
    );
    let (code, one, _) = cli(&["rollout", "history", "package", "hb", "--revision", "2"]);
    assert_eq!(code, Some(0));
    assert!(one.contains("kind: ObjectSet"), "{one}");
    assert_eq!(
        cli(&["rollout", "history", "package", "hb", "--revision", "9"]),
        (
            Some(1),
            String::new(),
            "Error: revision not found\n".to_owned()
        )
    );
    let (code, tree, stderr) = cli(&["clustertree", "package", "hb"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        tree.starts_with(&format!(
            "Package /hb\nnamespace/{ns}\n└── Phase config\n│   ├── /v1, Kind=ConfigMap "
        )),
        "{tree}"
    );
    assert!(
        tree.contains("hb-settings\n└── Phase app\n    └── /v1, Kind=ConfigMap "),
        "{tree}"
    );

    assert_eq!(
        cli(&["pause", "package", "hb", "-m", "maintenance window"]),
        (Some(0), String::new(), String::new())
    );
    let paused = package_api(&client, Some(&ns)).get("hb").await.unwrap();
    assert_eq!(paused.data["spec"]["paused"], true);
    assert_eq!(
        paused.metadata.annotations.unwrap()["package-operator.run/pause-message"],
        "maintenance window"
    );
    assert_eq!(
        cli(&["unpause", "package/hb"]),
        (Some(0), String::new(), String::new())
    );
    let unpaused = package_api(&client, Some(&ns)).get("hb").await.unwrap();
    assert_eq!(unpaused.data["spec"]["paused"], false);
    assert!(!unpaused
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key("package-operator.run/pause-message"));
    let (code, _, stderr) = cli(&["rollout", "history", "objectdeployment", "nope"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr
            .starts_with("Error: getting resource objectdeployment/nope: getting package object: "),
        "{stderr}"
    );
}

#[tokio::test]
async fn cel_filtering_package_drops_exactly_the_filtered_objects() {
    let (client, ns) = setup("ex-cel").await;
    let image = build_and_push("cel-filtering", "cel-filtering:v1");
    install(&client, Some(&ns), "single", &image, json!({})).await;
    wait_available(&client, Some(&ns), "single").await;
    assert!(get_cm(&client, &ns, "single-instance-notice")
        .await
        .is_some());
    assert!(get_cm(&client, &ns, "ha-budget").await.is_none());
    assert!(get_cm(&client, &ns, "app").await.is_some());

    let (_, ha_ns) = setup("ex-cel-ha").await;
    // As cel-filtering-ha.yaml.
    install(&client, Some(&ha_ns), "ha", &image, json!({"replicas": 3})).await;
    wait_available(&client, Some(&ha_ns), "ha").await;
    assert!(get_cm(&client, &ha_ns, "ha-budget").await.is_some());
    assert!(get_cm(&client, &ha_ns, "single-instance-notice")
        .await
        .is_none());
}

/// The message of the package's `type_` condition once it has `status` for the current generation.
async fn wait_condition_message(
    client: &kube::Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
) -> String {
    wait_object_condition(&package_api(client, Some(ns)), name, type_, status, None)
        .await
        .1
}

#[tokio::test]
async fn components_of_one_image_install_separately() {
    let (client, ns) = setup("ex-multi").await;
    let image = build_and_push("multi-component", "multi-component:v1");
    let ns_ref = Some(ns.as_str());
    install_spec(
        &client,
        ns_ref,
        "api",
        json!({"image": image, "component": "backend"}),
    )
    .await;
    install_spec(
        &client,
        ns_ref,
        "web",
        json!({"image": image, "component": "frontend"}),
    )
    .await;
    install_spec(&client, ns_ref, "base", json!({"image": image})).await;
    install_spec(
        &client,
        ns_ref,
        "db",
        json!({"image": image, "component": "db"}),
    )
    .await;
    wait_available(&client, ns_ref, "api").await;
    wait_available(&client, ns_ref, "web").await;
    wait_available(&client, ns_ref, "base").await;
    let backend = get_cm(&client, &ns, "api-backend-app").await.unwrap();
    assert_eq!(backend.data.unwrap()["tier"], "backend");
    assert!(get_cm(&client, &ns, "web-frontend-config").await.is_some());
    // The root package installs only its own objects, none of the components'.
    assert!(get_cm(&client, &ns, "multi-component-root").await.is_some());
    assert!(get_cm(&client, &ns, "base-backend-app").await.is_none());
    let message = wait_condition_message(&client, &ns, "db", "Invalid", "True").await;
    assert_eq!(
        message,
        "Component not found: \"db\" (components: backend, frontend)"
    );

    // A broken component fails its own Package naming the component, file and document; its sibling
    // works. `build` refuses a package with a broken component, so it is pushed as it is.
    let broken = push_unchecked("broken-component", "broken-component:v1").await;
    install_spec(
        &client,
        ns_ref,
        "bad",
        json!({"image": broken, "component": "bad"}),
    )
    .await;
    install_spec(
        &client,
        ns_ref,
        "good",
        json!({"image": broken, "component": "good"}),
    )
    .await;
    let message = wait_condition_message(&client, &ns, "bad", "Invalid", "True").await;
    assert_eq!(
        message,
        "component \"bad\": Missing package-operator.run/phase Annotation in objects.yaml idx 0"
    );
    wait_available(&client, ns_ref, "good").await;
}

#[tokio::test]
async fn locked_images_are_rendered_pinned_by_digest() {
    let (client, ns) = setup("ex-images").await;
    // Its lock names a registry the tests cannot reach, so `build` (which checks locked digests) would
    // refuse it.
    let image = push_unchecked("images", "images:v1").await;
    install(&client, Some(&ns), "images", &image, json!({})).await;
    wait_available(&client, Some(&ns), "images").await;
    let cm = get_cm(&client, &ns, "pinned-image").await.unwrap();
    assert_eq!(
        cm.data.unwrap()["image"],
        "registry.example/team/app@sha256:6f3c1e0b7d1a4e2c9b8a7f6e5d4c3b2a19081726354453627180918273645546"
    );
}

/// Every broken example, installed as a Package, is Invalid with the message `kubectl-package validate`
/// prints for it (`build` refuses them, so they are pushed through the library).
#[tokio::test]
async fn broken_example_packages_are_invalid_with_precise_messages() {
    let (client, ns) = setup("ex-broken").await;
    // broken-component's root package is fine: its component is tested in
    // components_of_one_image_install_separately.
    let cases: Vec<(String, String)> =
        std::fs::read_to_string(examples().join("expected-errors.txt"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.split_once('\t'))
            .filter(|(example, _)| *example != "broken-component")
            .map(|(e, m)| (e.to_owned(), m.to_owned()))
            .collect();
    assert_eq!(cases.len(), 10);
    for (example, _) in &cases {
        let image = push_unchecked(example, &format!("{example}:v1")).await;
        install(&client, Some(&ns), example, &image, json!({})).await;
    }
    for (example, expected) in &cases {
        let message = wait_condition_message(&client, &ns, example, "Invalid", "True").await;
        assert!(message.starts_with(expected), "{example}: {message}");
    }
}
