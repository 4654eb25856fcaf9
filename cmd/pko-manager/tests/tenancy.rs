//! Tenants against the shipped install: the manager runs on its own ServiceAccount with exactly the RBAC
//! deploy/manager grants, started with `--default-service-account pko-deployer`, and a tenant (a
//! ServiceAccount token, allowed ObjectSets, ObjectDeployments, Packages and ConfigMaps in its own
//! namespace and nothing else) creates the ObjectSets. What the tenant may not do itself, pko must not do
//! for it: write pko's own connector objects (the `escalate`/`bind` the manager holds for them), reach
//! another namespace or a cluster-scoped kind, or write a kind its namespace's deployer account may not.
//! Each refusal is a condition on the set, and the tenant gains no permission (SelfSubjectAccessReview).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PostParams;
use kube::{Api, Client};
use pko_testenv::{ManagerLaunch, ManagerProcess};
use serde_json::{json, Value};

use common::shipped::{install_tenant_manifests, manager_container_of};
use common::*;

const MANAGER_NAMESPACE: &str = "package-operator-system";
/// The account namespaced owners act as (`--default-service-account`).
const DEPLOYER: &str = "pko-deployer";

/// Tests that measure the manager's memory run alone (write); the others share (read), so what they
/// cost does not count against a measurement.
static MEASURING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The manager of this binary: the Deployment's arguments, its ServiceAccount's token, the shipped RBAC.
fn tenant_manager() -> &'static ManagerProcess {
    static MANAGER: OnceLock<Result<ManagerProcess, String>> = OnceLock::new();
    start_once(&MANAGER, start_manager)
}

async fn start_manager() -> Result<ManagerProcess, String> {
    install_tenant_manifests().await;
    // HostedClusters exist on this management cluster (whoever may create one may name it after a
    // tenant's namespace).
    pko_testenv::install_hosted_cluster_crd(env().management())
        .await
        .map_err(|e| e.to_string())?;
    let manager = start_replica().await?;
    manager
        .wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| format!("{e}\n{}", manager.log_tail()))?;
    Ok(manager)
}

/// A replica as the Deployment runs it (leader election: a second one stands by).
async fn start_replica() -> Result<ManagerProcess, String> {
    let kubeconfig = env()
        .management()
        .service_account_kubeconfig(MANAGER_NAMESPACE, "pko-manager")
        .await
        .map_err(|e| e.to_string())?;
    // The tenants install's arguments: --default-service-account=pko-deployer among them.
    let args: Vec<String> = manager_container_of("manager-tenants")["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .filter(|a| !a.starts_with("--health-addr"))
        .collect();
    assert!(
        args.contains(&format!("--default-service-account={DEPLOYER}")),
        "{args:?}"
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let launch = ManagerLaunch {
        kubeconfig: Some(kubeconfig),
        namespace: Some(MANAGER_NAMESPACE.to_owned()),
        ..ManagerLaunch::default()
    };
    let manager = env()
        .spawn_manager_with(Path::new(env!("CARGO_BIN_EXE_pko-manager")), &launch, &args)
        .map_err(|e| e.to_string())?;
    // Serving (a standby too): its health listener is up.
    pko_testenv::wait_until("the replica serves", Duration::from_secs(60), || async {
        match manager.get("/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .map_err(|e| format!("{e}\n{}", manager.log_tail()))?;
    Ok(manager)
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

/// A ServiceAccount `name` in `ns` holding `rules` there.
async fn account_with(admin: &Client, ns: &str, name: &str, rules: Vec<Value>) {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    let role: Role =
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// A tenant namespace: the tenant (a client on its own token) and the deployer account, which may write
/// ConfigMaps only.
async fn tenant(prefix: &str) -> (Client, Client, String) {
    tenant_manager();
    let admin = env().management().client().await.unwrap();
    let ns = env().management().create_namespace(prefix).await.unwrap();
    account_with(
        &admin,
        &ns,
        "tenant",
        vec![
            rule(
                &["package-operator.run"],
                &["objectsets", "objectdeployments", "packages"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(
                &[""],
                &["configmaps"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
        ],
    )
    .await;
    account_with(
        &admin,
        &ns,
        DEPLOYER,
        vec![rule(
            &[""],
            &["configmaps"],
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        )],
    )
    .await;
    let kubeconfig = env()
        .management()
        .service_account_kubeconfig(&ns, "tenant")
        .await
        .unwrap();
    let tenant = pko_testenv::client_for(&kubeconfig, "tenant")
        .await
        .unwrap();
    (admin, tenant, ns)
}

/// Whether the tenant may `verb` `resource` in `ns`, as the apiserver answers it.
async fn tenant_may(tenant: &Client, verb: &str, group: &str, resource: &str, ns: &str) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(tenant.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

fn object(api_version: &str, kind: &str, name: &str, rest: Value) -> Value {
    let mut object = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if let (Some(o), Some(r)) = (object.as_object_mut(), rest.as_object()) {
        o.extend(r.clone());
    }
    object
}

/// Waits for the set's Available=False and returns its message.
async fn refused(tenant: &Client, ns: &str, name: &str) -> String {
    wait_condition(tenant, ns, name, "Available", "False", None).await
}

#[tokio::test]
async fn a_tenant_cannot_become_admin_of_its_namespace_through_the_connector_role() {
    let _measuring = MEASURING.read().await;
    let (admin, tenant, ns) = tenant("escalate").await;
    assert!(!tenant_may(&tenant, "get", "", "secrets", &ns).await);
    let every_rule = object(
        "rbac.authorization.k8s.io/v1",
        "Role",
        "pko-connector",
        json!({"rules": [rule(&["*"], &["*"], &["*"])]}),
    );
    let binding = object(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "pko-connector",
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pko-connector"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}],
        }),
    );
    // The same escalation with the binding under another name, and as the owner's own account.
    let renamed = object(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "mine",
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pko-connector"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}],
        }),
    );
    let sets = [
        ("escalate", vec![every_rule.clone(), binding]),
        ("escalate-renamed", vec![every_rule, renamed]),
    ];
    for (name, objects) in &sets {
        create_set(
            &tenant,
            &ns,
            &object_set(name, &[("rbac", objects.clone())], json!({})),
        )
        .await;
    }
    for (name, _) in &sets {
        let message = refused(&tenant, &ns, name).await;
        assert!(
            message.contains("reserved for pko's hosted-cluster connector"),
            "{name}: {message}"
        );
    }
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns);
    assert!(roles.get_opt("pko-connector").await.unwrap().is_none());
    let bindings: Api<RoleBinding> = Api::namespaced(admin, &ns);
    assert!(bindings.get_opt("pko-connector").await.unwrap().is_none());
    assert!(bindings.get_opt("mine").await.unwrap().is_none());
    for (verb, group, resource) in [
        ("get", "", "secrets"),
        ("create", "", "pods/exec"),
        ("create", "", "serviceaccounts/token"),
        ("escalate", "rbac.authorization.k8s.io", "roles"),
    ] {
        assert!(
            !tenant_may(&tenant, verb, group, resource, &ns).await,
            "the tenant may {verb} {resource}"
        );
    }
}

#[tokio::test]
async fn a_namespaced_owner_reaches_neither_cluster_scope_nor_another_namespace() {
    let _measuring = MEASURING.read().await;
    let (admin, tenant, ns) = tenant("reach").await;
    let cluster_role = object(
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        &format!("{ns}-everything"),
        json!({"rules": [rule(&["*"], &["*"], &["*"])]}),
    );
    let elsewhere = object(
        "v1",
        "ConfigMap",
        "planted",
        json!({"metadata": {"name": "planted", "namespace": "default"}}),
    );
    create_set(
        &tenant,
        &ns,
        &object_set("cluster", &[("p", vec![cluster_role])], json!({})),
    )
    .await;
    create_set(
        &tenant,
        &ns,
        &object_set("elsewhere", &[("p", vec![elsewhere])], json!({})),
    )
    .await;
    let message = refused(&tenant, &ns, "cluster").await;
    assert!(message.contains("cluster-scoped"), "{message}");
    let message = refused(&tenant, &ns, "elsewhere").await;
    assert!(
        message.contains("outside the owner's namespace"),
        "{message}"
    );
    let cluster_roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    assert!(cluster_roles
        .get_opt(&format!("{ns}-everything"))
        .await
        .unwrap()
        .is_none());
    assert!(get_cm(&admin, "default", "planted").await.is_none());
}

#[tokio::test]
async fn under_the_default_service_account_a_tenant_deploys_only_what_that_account_may() {
    let _measuring = MEASURING.read().await;
    let (admin, tenant, ns) = tenant("deployer").await;
    // Allowed for the deployer: applied, probed and Available, then torn down on archival, all as it.
    let cm = configmap("allowed", json!({"k": "v"}));
    create_set(
        &tenant,
        &ns,
        &object_set("allowed", &[("p", vec![cm])], json!({})),
    )
    .await;
    wait_condition(&tenant, &ns, "allowed", "Available", "True", None).await;
    wait_cm(&admin, &ns, "allowed", |c| {
        c.data.as_ref().is_some_and(|d| d["k"] == "v")
    })
    .await;
    // Not allowed for the deployer (the manager itself may write Services): refused, naming who, what and
    // which object.
    let service = object(
        "v1",
        "Service",
        "web",
        json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}),
    );
    create_set(
        &tenant,
        &ns,
        &object_set("service", &[("p", vec![service.clone()])], json!({})),
    )
    .await;
    let message = refused(&tenant, &ns, "service").await;
    for part in [
        format!("system:serviceaccount:{ns}:{DEPLOYER}"),
        "services".to_owned(),
        "web".to_owned(),
    ] {
        assert!(message.contains(&part), "{part:?} not in {message}");
    }
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    assert!(services.get_opt("web").await.unwrap().is_none());
    // An owner naming another account of its namespace acts as that one once the account opted in;
    // before, the set is refused naming the label (issue 63, item 6).
    account_with(
        &admin,
        &ns,
        "service-deployer",
        vec![rule(
            &[""],
            &["services"],
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        )],
    )
    .await;
    let mut named = object_set("named", &[("p", vec![service])], json!({}));
    named.metadata.annotations = Some(
        [(
            "package-operator.run/service-account".to_owned(),
            "service-deployer".to_owned(),
        )]
        .into(),
    );
    create_set(&tenant, &ns, &named).await;
    let message = refused(&tenant, &ns, "named").await;
    assert!(
        message.contains("is not labelled package-operator.run/owners-may-use=true"),
        "{message}"
    );
    assert!(services.get_opt("web").await.unwrap().is_none());
    let opt_in = json!({"metadata": {"labels": {"package-operator.run/owners-may-use": "true"}}});
    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .patch(
            "service-deployer",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&opt_in),
        )
        .await
        .unwrap();
    wait_condition(&tenant, &ns, "named", "Available", "True", None).await;
    assert!(services.get_opt("web").await.unwrap().is_some());

    archive_set(&tenant, &ns, "allowed").await;
    wait_cm_gone(&admin, &ns, "allowed").await;
}

/// The manager's resident memory, in KiB.
fn resident_kib(manager: &ManagerProcess) -> u64 {
    rss_kib(manager.pid().unwrap())
}

#[tokio::test]
async fn objects_labelled_by_someone_else_are_not_held() {
    let _measuring = MEASURING.write().await;
    let (admin, tenant, ns) = tenant("flood").await;
    // pko watches ConfigMaps for a legitimate set.
    let cm = configmap("legit", json!({"k": "v"}));
    create_set(
        &tenant,
        &ns,
        &object_set("legit", &[("p", vec![cm])], json!({})),
    )
    .await;
    wait_condition(&tenant, &ns, "legit", "Available", "True", None).await;
    let manager = tenant_manager();
    let metric = "pko_managed_cache_foreign_objects_total";
    let foreign_before = manager.metric(metric).await.unwrap();
    let before = resident_kib(manager);
    // The tenant labels 100 ConfigMaps of nearly 1 MiB (the apiserver's limit) as pko's.
    const FLOOD: u64 = 100;
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(tenant.clone(), &ns);
    let filler = "x".repeat(1000 * 1024);
    for i in 0..FLOOD {
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("flood-{i}"), "labels": {"package-operator.run/cache": "True"},
                "annotations": {"package-operator.run/owners":
                    format!(r#"[{{"uid":"forged-{i}","kind":"ObjectSet","name":"x","controller":true}}]"#)}},
            "data": {"filler": filler},
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    pko_testenv::wait_until(
        "the manager saw every labelled ConfigMap",
        TIMEOUT,
        || async {
            let seen = manager.metric(metric).await? - foreign_before;
            if seen >= FLOOD {
                Ok(())
            } else {
                Err(format!("{seen} seen"))
            }
        },
    )
    .await
    .unwrap();
    let grown_kib = resident_kib(manager).saturating_sub(before);
    eprintln!(
        "manager RSS {before} KiB before, grown by {grown_kib} KiB for {FLOOD} labelled ConfigMaps"
    );
    assert!(
        grown_kib < 16 * 1024,
        "the manager grew by {grown_kib} KiB for {FLOOD} MiB of someone else's objects"
    );
    // No metric series for the forged owners.
    let (_, metrics) = manager.get("/metrics").await.unwrap();
    assert!(!metrics.contains("forged-"), "forged owners in the metrics");
    // The legitimate set still works: a change of its object is repaired.
    patch_cm(&admin, &ns, "legit", json!({"data": {"k": "drifted"}})).await;
    wait_cm(&admin, &ns, "legit", |c| {
        c.data.as_ref().is_some_and(|d| d["k"] == "v")
    })
    .await;
}

#[tokio::test]
async fn external_object_watches_end_with_their_last_reader() {
    let _measuring = MEASURING.read().await;
    let (_, tenant, ns) = tenant("external").await;
    let manager = tenant_manager();
    let gauge = "pko_external_object_watches";
    let baseline = manager.metric(gauge).await.unwrap();
    // 5,000 external objects (none exists) named by ten sets: each is watched while a set reads it.
    const SETS: usize = 10;
    const PER_SET: usize = 500;
    for s in 0..SETS {
        let external: Vec<Value> = (0..PER_SET)
            .map(|i| json!({"object": configmap(&format!("ext-{s}-{i}"), json!({}))}))
            .collect();
        let set = typed(
            "ObjectSet",
            &format!("reader-{s}"),
            json!({"phases": [{"name": "p", "objects": [], "externalObjects": external}]}),
            json!({}),
        );
        create_set(&tenant, &ns, &set).await;
    }
    let want = baseline + (SETS * PER_SET) as u64;
    pko_testenv::wait_until(
        "every external object watched",
        Duration::from_secs(180),
        || async {
            let open = manager.metric(gauge).await?;
            if open >= want {
                Ok(())
            } else {
                Err(format!("{open} watches, want {want}"))
            }
        },
    )
    .await
    .unwrap();
    let sets: Api<pko_proto::core::object_set::ObjectSet> = Api::namespaced(tenant.clone(), &ns);
    for s in 0..SETS {
        sets.delete(&format!("reader-{s}"), &Default::default())
            .await
            .unwrap();
    }
    pko_testenv::wait_until("no watch left behind", Duration::from_secs(120), || async {
        let open = manager.metric(gauge).await?;
        if open <= baseline {
            Ok(())
        } else {
            Err(format!("{open} watches, baseline {baseline}"))
        }
    })
    .await
    .unwrap();
}

/// The shipped manager, on its own ServiceAccount, starts its watches with streaming lists exactly where
/// the apiserver serves them: it asks once at start, and the answer follows the apiserver's `WatchList`
/// feature (on by default in current releases, off on the 1.27 floor), as the apiserver's own
/// `kubernetes_feature_enabled` reports it.
#[tokio::test]
async fn the_manager_streams_its_initial_lists_where_the_apiserver_serves_them() {
    let manager = tenant_manager();
    let admin = env().management().client().await.unwrap();
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let apiserver_metrics = admin.request_text(request).await.unwrap();
    let enabled = apiserver_metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"kubernetes_feature_enabled{name="WatchList",stage=""#))
        .map(|rest| rest.ends_with(" 1"))
        .expect("the apiserver reports its WatchList feature");
    let streaming = manager.metric("pko_watch_streaming_lists").await.unwrap();
    assert_eq!(
        streaming,
        u64::from(enabled),
        "WatchList enabled on the apiserver: {enabled}"
    );
}

/// Whoever may create a HostedCluster names it so that its HCP namespace (`<namespace>-<name>`) is a
/// tenant's namespace (issue 63, item 7): owners in an HCP namespace act as the manager, so the tenant
/// would get the manager's rights. Only a namespace HyperShift labelled is an HCP namespace.
#[tokio::test]
async fn a_hosted_cluster_named_after_a_tenant_namespace_does_not_make_it_a_control_plane() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Patch, PatchParams};
    use pko_proto::hypershift::{HostedCluster, CONTROL_PLANE_NAMESPACE_LABEL};
    let _measuring = MEASURING.read().await;
    let (admin, tenant, ns) = tenant("spoof").await;
    let (cluster_namespace, cluster_name) = ns.rsplit_once('-').unwrap();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": cluster_namespace}})).unwrap(),
        )
        .await;
    let cluster: HostedCluster = serde_json::from_value(json!({
        "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": cluster_name, "namespace": cluster_namespace},
        "spec": {"release": {"image": "simulated"}},
    }))
    .unwrap();
    Api::<HostedCluster>::namespaced(admin.clone(), cluster_namespace)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let label = |value: Option<&str>| json!({"metadata": {"labels": {CONTROL_PLANE_NAMESPACE_LABEL: value}}});
    let service = |name: &str| {
        object(
            "v1",
            "Service",
            name,
            json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}),
        )
    };
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    // Labelled as HyperShift labels the namespaces it makes: owners there act as the manager, which may
    // write Services (the deployer may not). This also shows the manager knows the HostedCluster.
    namespaces
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(&label(Some("true"))),
        )
        .await
        .unwrap();
    create_set(
        &tenant,
        &ns,
        &object_set("as-hcp", &[("p", vec![service("as-hcp")])], json!({})),
    )
    .await;
    wait_condition(&tenant, &ns, "as-hcp", "Available", "True", None).await;
    assert!(services.get_opt("as-hcp").await.unwrap().is_some());
    // Without HyperShift's label the HostedCluster's name alone does not make it one: the deployer acts.
    namespaces
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&label(None)))
        .await
        .unwrap();
    create_set(
        &tenant,
        &ns,
        &object_set("spoofed", &[("p", vec![service("spoofed")])], json!({})),
    )
    .await;
    let message = refused(&tenant, &ns, "spoofed").await;
    assert!(
        message.contains(&format!("system:serviceaccount:{ns}:{DEPLOYER}")),
        "{message}"
    );
    assert!(services.get_opt("spoofed").await.unwrap().is_none());
}
