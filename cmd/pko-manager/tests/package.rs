//! Packages end to end: an image pushed to the real registry, installed as a Package, rolled out through
//! its ObjectDeployment; image and package errors as conditions; upstream's YAML leniency (a key given
//! twice keeps its last value).
#![allow(clippy::unwrap_used)]

mod common;

use kube::api::{ApiResource, Patch, PatchParams, PostParams};
use kube::Api;
use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::ImageStore;
use pko_proto::core::object_deployment::ObjectDeployment;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::package::{ClusterPackage, Package};
use pko_testenv::wait_until;
use serde_json::json;

use common::packages::{create_package, package, push};
use common::*;

const MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata:
  name: greeter
spec:
  scopes: [Namespaced]
  phases:
  - name: config
  config:
    openAPIV3Schema:
      type: object
      properties:
        greeting:
          type: string
          default: hello
";

const CONFIGMAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .package.metadata.name }}-greeting
  annotations:
    package-operator.run/phase: config
data:
  greeting: {{ .config.greeting | quote }}
  kube: {{ .environment.kubernetes.version | quote }}
";

/// The greeter package (MANIFEST + CONFIGMAP), pushed as `greeter:v1`.
async fn push_greeter() -> String {
    push(
        "greeter:v1",
        &[("manifest.yaml", MANIFEST), ("cm.yaml.gotmpl", CONFIGMAP)],
    )
    .await
}

async fn wait_package(
    client: &kube::Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    wait_object_condition(
        &package_api(client, Some(ns)),
        name,
        type_,
        status,
        Some(reason),
    )
    .await
    .1
}

#[tokio::test]
async fn package_rolls_out_and_updates_with_its_config() {
    let (client, ns) = setup("pkg-greeter").await;
    let image = push_greeter().await;
    let packages = Api::<Package>::namespaced(client.clone(), &ns);
    create_package(&client, &ns, "hello", &image, json!({"greeting": "hi"})).await;

    wait_package(&client, &ns, "hello", "Available", "True", "Available").await;
    wait_package(&client, &ns, "hello", "Unpacked", "True", "UnpackSuccess").await;
    let cm = wait_cm(&client, &ns, "hello-greeting", |_| true).await;
    let data = cm.data.unwrap();
    assert_eq!(data["greeting"], "hi");
    let version = client.apiserver_version().await.unwrap().git_version;
    assert_eq!(data["kube"], version, "{:?}", data["kube"]);
    let od = Api::<ObjectDeployment>::namespaced(client.clone(), &ns)
        .get("hello")
        .await
        .unwrap();
    let p = packages.get("hello").await.unwrap();
    assert_eq!(
        od.metadata.owner_references.unwrap()[0].uid,
        p.metadata.uid.unwrap()
    );
    assert_eq!(
        od.metadata.labels.unwrap()["package-operator.run/package"],
        "greeter"
    );
    assert!(!p.status.unwrap().unpacked_hash.is_empty());

    // A config change rolls a new revision; the ConfigMap follows.
    packages
        .patch(
            "hello",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"config": {"greeting": "hello again"}}})),
        )
        .await
        .unwrap();
    wait_cm(&client, &ns, "hello-greeting", |cm| {
        cm.data
            .as_ref()
            .is_some_and(|d| d["greeting"] == "hello again")
    })
    .await;
    let od_api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    wait_until("revision 2", TIMEOUT, || async {
        let od = od_api.get("hello").await.map_err(|e| e.to_string())?;
        match od.status.and_then(|s| s.revision) {
            Some(2) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    wait_until("the Package reports revision 2", TIMEOUT, || async {
        let p = packages.get("hello").await.map_err(|e| e.to_string())?;
        match p.status.map(|s| s.revision) {
            Some(2) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_template_that_renders_a_key_twice_keeps_the_last_value() {
    let (client, ns) = setup("pkg-dupkey").await;
    // Upstream's YAML library takes the last of duplicate keys; packages written for it rely on that.
    let twice = format!("{CONFIGMAP}  greeting: \"last\"\n");
    let image = push(
        "dupkey:v1",
        &[("manifest.yaml", MANIFEST), ("cm.yaml.gotmpl", &twice)],
    )
    .await;
    create_package(&client, &ns, "twice", &image, json!({"greeting": "hi"})).await;
    wait_package(&client, &ns, "twice", "Available", "True", "Available").await;
    let cm = wait_cm(&client, &ns, "twice-greeting", |_| true).await;
    assert_eq!(cm.data.unwrap()["greeting"], "last");
}

#[tokio::test]
async fn image_and_package_errors_are_conditions() {
    let (client, ns) = setup("pkg-errors").await;
    let host = env().registry().host();
    create_package(
        &client,
        &ns,
        "ghost",
        &format!("{host}/packages/ghost:v1"),
        json!({}),
    )
    .await;
    let message = wait_package(
        &client,
        &ns,
        "ghost",
        "Unpacked",
        "False",
        "ImagePullBackOff",
    )
    .await;
    assert!(message.contains("not found"), "{message}");

    let broken = push(
        "broken:v1",
        &[
            ("manifest.yaml", MANIFEST),
            (
                "cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
            ),
        ],
    )
    .await;
    create_package(&client, &ns, "broken", &broken, json!({})).await;
    let message = wait_package(&client, &ns, "broken", "Invalid", "True", "LoadError").await;
    assert_eq!(
        message,
        "Missing package-operator.run/phase Annotation in cm.yaml idx 0"
    );

    // Config is admitted against the manifest's schema.
    let good = push_greeter().await;
    create_package(&client, &ns, "typo", &good, json!({"greeting": 5})).await;
    let message = wait_package(&client, &ns, "typo", "Invalid", "True", "LoadError").await;
    assert_eq!(
        message,
        "spec.config.greeting: Invalid value: \"integer\": spec.config.greeting in body must be of type string: \"integer\""
    );

    // A Namespaced-only package installed cluster-wide is invalid, with the reason.
    let cluster = Api::<ClusterPackage>::all(client.clone());
    let name = format!("{ns}-cluster");
    let cp: ClusterPackage = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ClusterPackage",
        "metadata": {"name": name}, "spec": {"image": good, "config": {"greeting": "x"}},
    }))
    .unwrap();
    cluster.create(&PostParams::default(), &cp).await.unwrap();
    let (_, message) = wait_object_condition(
        &package_api(&client, None),
        &name,
        "Invalid",
        "True",
        Some("LoadError"),
    )
    .await;
    assert_eq!(
        message,
        "Package unsupported scope in manifest.yaml: installed as ClusterPackage, the manifest declares Namespaced"
    );
}

#[tokio::test]
async fn an_image_bomb_is_refused_naming_the_limit_and_the_manager_stays_small() {
    let (client, ns) = setup("pkg-bomb").await;
    let host = env().registry().host();
    // 64 MiB of zeros in 64 files: a layer of about 64 KiB.
    let chunk = vec![0u8; 1024 * 1024];
    let mut bomb: PackageFiles = (0..64)
        .map(|i| (format!("zeros-{i:03}.yaml"), chunk.clone()))
        .collect();
    bomb.insert("manifest.yaml".to_owned(), MANIFEST.as_bytes().to_vec());
    let image = format!("{host}/packages/bomb:v1");
    ImageStore::new(vec![host])
        .push(&image, &bomb, &RegistryAuth::Anonymous)
        .await
        .unwrap();
    drop(bomb);
    let pid = manager().pid().unwrap();
    let before = rss_kib(pid);
    let started = std::time::Instant::now();
    create_package(&client, &ns, "bomb", &image, json!({})).await;
    let message = wait_package(&client, &ns, "bomb", "Unpacked", "False", "ImageRefused").await;
    let after = rss_kib(pid);
    println!(
        "image bomb refused in {:?}; manager RSS {} MiB before, {} MiB after",
        started.elapsed(),
        before / 1024,
        after / 1024
    );
    assert!(message.ends_with("(--max-compression-ratio)"), "{message}");
    // The rest of the manager goes on: a good package next to it becomes Available.
    let good = push_greeter().await;
    create_package(&client, &ns, "neighbour", &good, json!({"greeting": "hi"})).await;
    wait_package(&client, &ns, "neighbour", "Available", "True", "Available").await;
}

#[tokio::test]
async fn pausing_a_package_pauses_its_revisions_until_unpaused() {
    let (client, ns) = setup("pkg-pause").await;
    let image = push_greeter().await;
    let packages = Api::<Package>::namespaced(client.clone(), &ns);
    create_package(&client, &ns, "held", &image, json!({"greeting": "hi"})).await;
    wait_package(&client, &ns, "held", "Available", "True", "Available").await;

    packages
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    wait_package(&client, &ns, "held", "Paused", "True", "Paused").await;
    let od = Api::<ObjectDeployment>::namespaced(client.clone(), &ns)
        .get("held")
        .await
        .unwrap();
    assert!(od.spec.paused);
    let sets = Api::<pko_proto::core::object_set::ObjectSet>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        sets.iter()
            .all(|s| s.spec.lifecycle_state.as_str() == "Paused"),
        "{sets:?}"
    );

    // Unpausing puts pko's value back over an edit made meanwhile. (That a paused revision writes nothing
    // at all is asserted in object_set.rs, where a probe makes the paused set observe the edit.)
    patch_cm(
        &client,
        &ns,
        "held-greeting",
        json!({"data": {"greeting": "manual"}}),
    )
    .await;
    packages
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    wait_cm(&client, &ns, "held-greeting", |cm| {
        cm.data.as_ref().is_some_and(|d| d["greeting"] == "hi")
    })
    .await;
    wait_package(&client, &ns, "held", "Available", "True", "Available").await;
}

/// The manager's ServiceAccount (its defaults: package-operator-system/package-operator) with a pull
/// secret for the authenticated registry.
async fn grant_pull_secret(client: &kube::Client, host: &str) {
    use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
    let (user, password) = env().authenticated_registry().credentials().unwrap();
    // The environment made the manager's namespace when it started the manager.
    let ns = "package-operator-system";
    Api::<Namespace>::all(client.clone()).get(ns).await.unwrap();
    let config = json!({"auths": {host: {"username": user, "password": password}}});
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "registry-pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let account: ServiceAccount = serde_json::from_value(json!({
        "metadata": {"name": "package-operator"},
        "imagePullSecrets": [{"name": "registry-pull"}],
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
}

#[tokio::test]
async fn private_images_pull_with_the_service_accounts_pull_secrets() {
    let (client, ns) = setup("pkg-private").await;
    let registry = env().authenticated_registry();
    let host = registry.host();
    let (user, password) = registry.credentials().unwrap();
    let image = format!("{host}/private/greeter:v1");
    let files: PackageFiles = [("manifest.yaml", MANIFEST), ("cm.yaml.gotmpl", CONFIGMAP)]
        .iter()
        .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
        .collect();
    let basic = RegistryAuth::Basic(user.to_owned(), password.to_owned());
    ImageStore::new(vec![host.clone()])
        .push(&image, &files, &basic)
        .await
        .unwrap();
    // Anonymous pushes are refused: the registry really wants credentials.
    assert!(ImageStore::new(vec![host.clone()])
        .push(&image, &files, &RegistryAuth::Anonymous)
        .await
        .is_err());

    create_package(&client, &ns, "private", &image, json!({"greeting": "psst"})).await;
    let message = wait_package(
        &client,
        &ns,
        "private",
        "Unpacked",
        "False",
        "ImagePullBackOff",
    )
    .await;
    assert!(message.contains("access denied"), "{message}");

    // With the pull secret on the manager's ServiceAccount the next retry pulls it; no restart.
    grant_pull_secret(&client, &host).await;
    wait_package(&client, &ns, "private", "Available", "True", "Available").await;
    let cm = get_cm(&client, &ns, "private-greeting").await.unwrap();
    assert_eq!(cm.data.unwrap()["greeting"], "psst");
}

/// Pulls close together share one read of the manager's ServiceAccount and its pull secrets: a rollout
/// wave of Package updates does not read them once per Package.
#[tokio::test]
async fn pulls_close_together_read_the_pull_secrets_once() {
    let (client, ns) = setup("pkg-burst").await;
    let image = push_greeter().await;
    let kept = || async {
        manager()
            .metric("pko_package_pull_credentials_total{source=\"kept\"}")
            .await
            .unwrap_or(0)
    };
    let before = kept().await;
    let names = ["burst-a", "burst-b", "burst-c"];
    futures::future::join_all(
        names
            .iter()
            .map(|name| create_package(&client, &ns, name, &image, json!({}))),
    )
    .await;
    for name in names {
        wait_package(&client, &ns, name, "Available", "True", "Available").await;
    }
    // Three pulls within the TTL: at most one read; other tests' pulls only add to the count.
    let after = kept().await;
    assert!(
        after >= before + 2,
        "credentials kept for {} of 3 pulls",
        after - before
    );
}

const THREE_CONFIGMAPS: &str = "{{- range $name := list \"a\" \"b\" \"c\" }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $.package.metadata.name }}-{{ $name }}
  annotations:
    package-operator.run/phase: config
data:
  greeting: {{ $.config.greeting | quote }}
  name: {{ $name }}
{{- end }}
";

#[tokio::test]
async fn chunked_packages_store_their_objects_in_slices() {
    use pko_proto::core::object_slice::ObjectSlice;
    let (client, ns) = setup("pkg-chunks").await;
    let image = push(
        "chunked:v1",
        &[
            ("manifest.yaml", MANIFEST),
            ("cms.yaml.gotmpl", THREE_CONFIGMAPS),
        ],
    )
    .await;
    let mut chunked = package("chunked", &image, json!({"greeting": "hi"}));
    chunked.metadata.annotations = Some(
        [(
            "packages.package-operator.run/chunking-strategy".to_owned(),
            "EachObject".to_owned(),
        )]
        .into(),
    );
    let packages = Api::<Package>::namespaced(client.clone(), &ns);
    packages
        .create(&PostParams::default(), &chunked)
        .await
        .unwrap();
    wait_package(&client, &ns, "chunked", "Available", "True", "Available").await;
    for name in ["chunked-a", "chunked-b", "chunked-c"] {
        assert!(get_cm(&client, &ns, name).await.is_some(), "{name}");
    }
    let od = Api::<ObjectDeployment>::namespaced(client.clone(), &ns)
        .get("chunked")
        .await
        .unwrap();
    let phase = &od.spec.template.spec.phases[0];
    assert!(phase.objects.is_empty());
    assert_eq!(phase.slices.len(), 3);
    let slices = Api::<ObjectSlice>::namespaced(client.clone(), &ns);
    let owned_by_package = |list: &[ObjectSlice], uid: &str| -> Vec<String> {
        let mut names: Vec<String> = list
            .iter()
            .filter(|s| {
                s.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            })
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        names
    };
    let uid = packages.get("chunked").await.unwrap().metadata.uid.unwrap();
    let listed = slices
        .list(&kube::api::ListParams::default().labels("slices.package-operator.run/owner=chunked"))
        .await
        .unwrap()
        .items;
    let mut expected = phase.slices.clone();
    expected.sort();
    assert_eq!(owned_by_package(&listed, &uid), expected);

    // New config: three new slices; the Package lets go of the old ones (their revision keeps them).
    packages
        .patch(
            "chunked",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"config": {"greeting": "hello"}}})),
        )
        .await
        .unwrap();
    wait_cm(&client, &ns, "chunked-b", |cm| {
        cm.data.as_ref().is_some_and(|d| d["greeting"] == "hello")
    })
    .await;
    let od = Api::<ObjectDeployment>::namespaced(client.clone(), &ns)
        .get("chunked")
        .await
        .unwrap();
    let mut current = od.spec.template.spec.phases[0].slices.clone();
    current.sort();
    assert!(current.iter().all(|s| !expected.contains(s)));
    wait_until(
        "the Package owns only the current slices",
        TIMEOUT,
        || async {
            let listed = slices
                .list(
                    &kube::api::ListParams::default()
                        .labels("slices.package-operator.run/owner=chunked"),
                )
                .await
                .map_err(|e| e.to_string())?
                .items;
            let owned = owned_by_package(&listed, &uid);
            if owned == current {
                Ok(())
            } else {
                Err(format!("{owned:?}"))
            }
        },
    )
    .await
    .unwrap();

    // An unknown strategy is a clear Invalid.
    packages
        .patch(
            "chunked",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {
                "packages.package-operator.run/chunking-strategy": "Everything"}}})),
        )
        .await
        .unwrap();
    let message = wait_package(&client, &ns, "chunked", "Invalid", "True", "LoadError").await;
    assert_eq!(
        message,
        "annotation packages.package-operator.run/chunking-strategy: \"Everything\" is not NoOp, EachObject or BinpackNextFit"
    );
}

#[tokio::test]
async fn packages_in_an_hcp_namespace_see_their_hosted_cluster() {
    let (client, _) = setup("pkg-hcp").await;
    let clusters = env().simulate_hypershift().await.unwrap();
    let cluster = &clusters[0];
    let template = "apiVersion: v1
kind: ConfigMap
metadata:
  name: hc-facts
  annotations:
    package-operator.run/phase: config
data:
  cluster: {{ .environment.hyperShift.hostedCluster.metadata.name | quote }}
  namespace: {{ .environment.hyperShift.hostedCluster.metadata.namespace | quote }}
  hcp: {{ .environment.hyperShift.hostedCluster.hostedClusterNamespace | quote }}
";
    let image = push(
        "hcp-facts:v1",
        &[("manifest.yaml", MANIFEST), ("cm.yaml.gotmpl", template)],
    )
    .await;
    create_package(&client, &cluster.hcp_namespace, "facts", &image, json!({})).await;
    let cm = wait_cm(&client, &cluster.hcp_namespace, "hc-facts", |_| true).await;
    let data = cm.data.unwrap();
    assert_eq!(data["cluster"], cluster.name);
    assert_eq!(data["namespace"], cluster.namespace);
    assert_eq!(data["hcp"], cluster.hcp_namespace);
}

/// A cluster-scoped stand-in CRD of OpenShift's config API (every field kept, no status subresource).
const WIDGET_MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata:
  name: widget
spec:
  scopes: [Namespaced]
  phases:
  - name: deploy
  availabilityProbes:
  - selector:
      kind:
        group: sim.pko.test
        kind: Widget
    probes:
    - condition:
        type: Available
        status: \"True\"
";

const WIDGET: &str = "apiVersion: sim.pko.test/v1
kind: Widget
metadata:
  name: widget
  annotations:
    package-operator.run/phase: deploy
spec:
  release: v1
";

/// `package_operator_managed_cache_objects_total` counts a Package's workload by the time the Package is
/// Available, and has dropped it by the time the Package is gone when the Package is deleted in the
/// foreground (issue 38, item 9): the collector then waits for the deployment, which waits for its sets,
/// whose teardown finalizer goes only after their objects were seen gone. Upstream's test counts a
/// Deployment, here a Widget the workload simulator makes ready, since kube-controller-manager would race
/// the simulator for a Deployment's status.
#[tokio::test]
async fn the_managed_cache_metric_counts_a_packages_workload_while_it_lives() {
    let (client, ns) = setup("pkg-cache-metric").await;
    workload::install_widget_crd(&client, workload::WIDGET_GROUP).await;
    let _ready = workload::widgets(&client, [ns.clone()].into());
    let image = push(
        "widget:v1",
        &[("manifest.yaml", WIDGET_MANIFEST), ("widget.yaml", WIDGET)],
    )
    .await;
    create_package(&client, &ns, "widget", &image, json!({})).await;
    wait_package(&client, &ns, "widget", "Available", "True", "Available").await;
    // Read once, as soon as the Package is Available.
    let widget = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &workload::widget_resource(),
    )
    .get("widget")
    .await
    .unwrap();
    let owner = controller_ref(&widget.metadata).unwrap().uid.clone();
    let gvk = format!("{}/v1, Kind=Widget", workload::WIDGET_GROUP);
    assert_counted_once(&owner, &gvk).await;

    let packages = Api::<Package>::namespaced(client.clone(), &ns);
    packages
        .delete("widget", &kube::api::DeleteParams::foreground())
        .await
        .unwrap();
    let kinds = [
        ApiResource::erase::<Package>(&()),
        ApiResource::erase::<ObjectDeployment>(&()),
        ApiResource::erase::<ObjectSet>(&()),
        workload::widget_resource(),
    ];
    wait_gone_explained(&packages, "widget", &ns, &kinds).await;
    // Read once, as soon as the Package is gone.
    assert_counted_none(&owner).await;
}

/// The managed-cache gauge's series of one owner, and of one kind when given.
async fn managed_cache_series(owner_uid: &str, gvk: Option<&str>) -> Vec<String> {
    let owner = format!("owner=\"{owner_uid}\"");
    let kind = gvk.map(|gvk| format!("gvk=\"{gvk}\""));
    let labels: Vec<&str> = std::iter::once(owner.as_str())
        .chain(kind.as_deref())
        .collect();
    series("package_operator_managed_cache_objects_total", &labels).await
}

/// The owner's objects of the kind are counted, as one.
async fn assert_counted_once(owner_uid: &str, gvk: &str) {
    let counted = managed_cache_series(owner_uid, Some(gvk)).await;
    assert_eq!(counted.len(), 1, "{gvk} under {owner_uid} not counted");
    assert!(counted[0].ends_with(" 1"), "{counted:?}");
}

/// Nothing of the owner is counted any more.
async fn assert_counted_none(owner_uid: &str) {
    let left = managed_cache_series(owner_uid, None).await;
    assert!(
        left.is_empty(),
        "{owner_uid} is gone, still counted: {left:?}"
    );
}

const DEPLOYMENT_MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata:
  name: stub
spec:
  scopes: [Cluster]
  phases:
  - name: deploy
  availabilityProbes:
  - selector:
      kind:
        group: apps
        kind: Deployment
    probes:
    - condition:
        type: Available
        status: \"True\"
";

/// Upstream's metrics scenario with a ClusterPackage holding one Deployment: the managed-cache gauge for
/// `apps/v1, Kind=Deployment` counts it (under its ClusterObjectSet) once the ClusterPackage is
/// Available, and no longer once the ClusterPackage is gone. No pods run here: with no replicas,
/// kube-controller-manager itself reports the Deployment Available.
#[tokio::test]
async fn the_managed_cache_metric_counts_a_cluster_packages_deployment_while_it_lives() {
    let (client, ns) = setup("cpkg-cache-metric").await;
    let deployment = format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: stub
  namespace: {ns}
  annotations:
    package-operator.run/phase: deploy
spec:
  replicas: 0
  selector:
    matchLabels: {{app: stub}}
  template:
    metadata:
      labels: {{app: stub}}
    spec:
      containers:
      - name: stub
        image: registry.example/stub:1
"
    );
    let image = push(
        &format!("cluster-stub-{ns}:v1"),
        &[
            ("manifest.yaml", DEPLOYMENT_MANIFEST),
            ("deployment.yaml", &deployment),
        ],
    )
    .await;
    let name = format!("{ns}-stub");
    let packages = Api::<ClusterPackage>::all(client.clone());
    let cp: ClusterPackage = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ClusterPackage",
        "metadata": {"name": name}, "spec": {"image": image},
    }))
    .unwrap();
    packages.create(&PostParams::default(), &cp).await.unwrap();
    wait_object_condition(
        &package_api(&client, None),
        &name,
        "Available",
        "True",
        Some("Available"),
    )
    .await;
    // Read once, as soon as the ClusterPackage is Available.
    let stub = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &ns)
        .get("stub")
        .await
        .unwrap();
    let owner = controller_ref(&stub.metadata).unwrap();
    assert_eq!(owner.kind, "ClusterObjectSet");
    assert_counted_once(&owner.uid, "apps/v1, Kind=Deployment").await;

    packages
        .delete(&name, &kube::api::DeleteParams::foreground())
        .await
        .unwrap();
    wait_gone(&packages, &name).await;
    // Read once, as soon as the ClusterPackage is gone.
    assert_counted_none(&owner.uid).await;
}

const POD_MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata:
  name: restricted-pod
spec:
  scopes: [Namespaced]
  phases:
  - name: deploy
";

/// A Pod that meets the restricted Pod Security Standard, as a package ships it.
const RESTRICTED_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: worker
  annotations:
    package-operator.run/phase: deploy
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
  - name: worker
    image: registry.example/worker:1
    securityContext:
      allowPrivilegeEscalation: false
      capabilities:
        drop: [ALL]
";

/// A package's Pod in a namespace enforcing the restricted Pod Security Standard is admitted (with the
/// bound service-account token the apiserver projects into it; no token Secret is needed any more).
#[tokio::test]
async fn a_packages_restricted_pod_is_admitted_in_a_restricted_namespace() {
    let (client, ns) = setup("pkg-restricted").await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"}}})),
        )
        .await
        .unwrap();
    let image = push(
        &format!("restricted-pod-{ns}:v1"),
        &[
            ("manifest.yaml", POD_MANIFEST),
            ("pod.yaml", RESTRICTED_POD),
        ],
    )
    .await;
    create_package(&client, &ns, "worker", &image, json!({})).await;
    wait_package(&client, &ns, "worker", "Available", "True", "Available").await;
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
        .get("worker")
        .await
        .unwrap();
    let projected = pod
        .spec
        .unwrap()
        .volumes
        .unwrap_or_default()
        .into_iter()
        .any(|v| {
            v.projected.is_some_and(|p| {
                p.sources
                    .unwrap_or_default()
                    .iter()
                    .any(|s| s.service_account_token.is_some())
            })
        });
    assert!(
        projected,
        "the apiserver projected a bound token into the Pod"
    );
}
