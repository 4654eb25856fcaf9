//! pko installed as an SRE installs it, on the real environment (RBAC on): `kubectl kustomize
//! deploy/manager` applied with kubectl, NATS trust made by `pko-manager nats-bootstrap` and a
//! nats-server run from `deploy/nats/nats.conf`, and the manager running with the token of the
//! ServiceAccount the manifests create, with the Deployment's own arguments. It rolls a
//! HostedClusterPackage with hosted-cluster phases across the hosted clusters while a real Prometheus
//! scrapes it (with pko's alert rules loaded); the rollout gauges move and end at total = updated =
//! available, every dashboard query returns data, and the Events tell the rollout in order. A second
//! test asks the apiserver (SubjectAccessReview) what the manager's role allows and refuses; a third
//! runs the alert rules' promtool unit tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{ListParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_testenv::{run_with_input, wait_until, Dashboard, ManagerLaunch, Prometheus};
use serde_json::Value;

use common::rollout::{all_available, hcpkg_over_all, wait_status};
use common::shipped::{
    deploy_dir, install_manifests, kubectl_apply, kustomize, manager_container, parsed,
};

use common::*;

const NAMESPACE: &str = "package-operator-system";
const SERVICE_ACCOUNT: &str = "pko-manager";

/// Runs `pko-manager nats-bootstrap` as an admin; returns its stdout.
fn nats_bootstrap(resolver_file: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pko-manager"))
        .arg("--kubeconfig")
        .arg(env().management().kubeconfig_path())
        .arg("nats-bootstrap")
        .arg("--resolver-file")
        .arg(resolver_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn secret_value(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

#[tokio::test]
async fn installed_from_its_manifests_pko_rolls_out_on_its_own_service_account_and_prometheus_sees_it(
) {
    let env = env();
    install_manifests().await;
    let client = env.management().client().await.unwrap();

    // NATS trust, twice: the second run changes nothing, and no seed is printed.
    let dir = env.root_dir().join("install-nats");
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::create_dir_all(dir.join("resolver")).unwrap();
    let resolver_file = dir.join("resolver").join("resolver.conf");
    let first = nats_bootstrap(&resolver_file);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let versions = || async {
        let account = secrets.get("pko-nats-account").await.unwrap();
        let operator = secrets.get("pko-nats-operator").await.unwrap();
        let resolver = configmaps.get("pko-nats-resolver").await.unwrap();
        [account, operator]
            .iter()
            .map(|s| s.metadata.resource_version.clone().unwrap())
            .chain([resolver.metadata.resource_version.clone().unwrap()])
            .collect::<Vec<_>>()
    };
    let before = versions().await;
    let second = nats_bootstrap(&resolver_file);
    assert_eq!(
        versions().await,
        before,
        "a second bootstrap writes nothing"
    );
    assert_eq!(
        second
            .lines()
            .filter(|l| l.ends_with(": unchanged"))
            .count(),
        4,
        "first run:\n{first}\nsecond run:\n{second}"
    );
    let account_secret = secrets.get("pko-nats-account").await.unwrap();
    let (seed, account) = (
        secret_value(&account_secret, "account.seed"),
        secret_value(&account_secret, "account"),
    );
    let operator_secret = secrets.get("pko-nats-operator").await.unwrap();
    for printed in [&first, &second] {
        for (key, value) in operator_secret.data.as_ref().unwrap() {
            if key.ends_with(".seed") {
                let value = String::from_utf8(value.0.clone()).unwrap();
                assert!(!printed.contains(value.trim()), "{key} printed");
            }
        }
    }
    let resolver = configmaps.get("pko-nats-resolver").await.unwrap();
    assert_eq!(
        resolver.data.unwrap()["resolver.conf"],
        std::fs::read_to_string(&resolver_file).unwrap()
    );
    // The shipped server configuration, laid out as its StatefulSet mounts it.
    let config = dir.join("config").join("nats.conf");
    std::fs::copy(deploy_dir().join("nats/nats.conf"), &config).unwrap();
    let nats = env
        .start_nats_from("install-nats", &config, &seed, &account)
        .await
        .unwrap();

    // The manager, with its ServiceAccount's token and the Deployment's arguments.
    let kubeconfig = env
        .management()
        .service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)
        .await
        .unwrap();
    let container = manager_container();
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .filter(|a| !a.starts_with("--health-addr"))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let launch = ManagerLaunch {
        kubeconfig: Some(kubeconfig),
        namespace: Some(NAMESPACE.to_owned()),
        nats: Some(&nats),
        ..ManagerLaunch::default()
    };
    let manager = env
        .spawn_manager_with(Path::new(env!("CARGO_BIN_EXE_pko-manager")), &launch, &args)
        .unwrap();
    manager
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", manager.log_tail()));
    let prometheus = Prometheus::start(
        &env.root_dir().join("install-prometheus"),
        "pko-manager",
        &[format!("127.0.0.1:{}", manager.health_port())],
        &[deploy_dir().join("monitoring/pko-alerts.yaml")],
        Duration::from_secs(1),
    )
    .await
    .unwrap();

    // A fleet of the two hosted clusters; their connectors are not running yet.
    let clusters = env.simulate_hypershift().await.unwrap();
    let image = build_and_push("hosted-addon", "install-hosted-addon:v1");
    let name = "install-addon";
    let hcpkg = hcpkg_over_all(name, &image);
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    api.create(&PostParams::default(), &hcpkg).await.unwrap();

    // Prometheus sees the gauges move and end at total = updated = available.
    let total = clusters.len() as f64;
    let gauge = |state: &str| {
        format!(
            r#"pko_hostedclusterpackage_packages{{hostedclusterpackage="{name}",state="{state}"}}"#
        )
    };
    // Without connectors the new Packages (created at once: there is nothing to keep available yet)
    // cannot become available, and Prometheus shows the rollout under way.
    let value = |samples: Vec<pko_testenv::Sample>| samples.first().map(|s| s.value);
    wait_until("Prometheus: every package created, none available", TIMEOUT, || async {
        let counts = (
            value(prometheus.query(&gauge("total")).await?),
            value(prometheus.query(&gauge("updated")).await?),
            value(prometheus.query(&gauge("available")).await?),
        );
        let progressing = value(prometheus.query(&format!(
            r#"pko_hostedclusterpackage_rollout_state{{hostedclusterpackage="{name}",state="progressing"}}"#
        )).await?);
        if counts == (Some(total), Some(total), Some(0.0)) && progressing == Some(1.0) {
            Ok(())
        } else {
            Err(format!("total, updated, available: {counts:?}, progressing {progressing:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", manager.log_tail()));
    // The connectors start (as a kubelet would run their Deployments, with their own ServiceAccounts).
    let _runner = env
        .start_connector_runner(&connector_binary())
        .await
        .unwrap();
    wait_until(
        "Prometheus: every package updated and available",
        TIMEOUT,
        || async {
            let counts = (
                value(prometheus.query(&gauge("total")).await?),
                value(prometheus.query(&gauge("updated")).await?),
                value(prometheus.query(&gauge("available")).await?),
            );
            if counts == (Some(total), Some(total), Some(total)) {
                Ok(())
            } else {
                Err(format!("total, updated, available: {counts:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", manager.log_tail()));
    wait_status(
        &api,
        name,
        || manager.log_tail(),
        "all available",
        |h| all_available(h, clusters.len() as i32),
    )
    .await;
    for (expr, want) in [
        (
            format!(
                r#"pko_hostedclusterpackage_rollout_state{{hostedclusterpackage="{name}",state="finished"}}"#
            ),
            1.0,
        ),
        (
            format!(r#"pko_hostedclusterpackage_max_unavailable{{hostedclusterpackage="{name}"}}"#),
            1.0,
        ),
        (
            format!(
                r#"package_operator_package_availability{{pko_name="{name}",pko_namespace="{}"}}"#,
                clusters[0].hcp_namespace
            ),
            1.0,
        ),
        (
            format!(
                r#"pko_connector_connected{{namespace="{}"}}"#,
                clusters[1].hcp_namespace
            ),
            1.0,
        ),
    ] {
        wait_until(&expr, TIMEOUT, || async {
            match prometheus.query(&expr).await?.first() {
                Some(s) if s.value == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
    }

    // Upstream's revision and managed-cache metrics, with upstream's labels.
    let hcp0 = &clusters[0].hcp_namespace;
    for expr in [
        format!(
            r#"package_operator_object_set_created_timestamp_seconds{{pko_namespace="{hcp0}",pko_package_instance="{name}"}} > 0"#
        ),
        format!(
            r#"package_operator_object_set_succeeded_timestamp_seconds{{pko_namespace="{hcp0}",pko_package_instance="{name}"}} > 0"#
        ),
        r#"package_operator_managed_cache_objects_total{gvk="apps/v1, Kind=Deployment"} >= 1"#
            .to_owned(),
        r#"package_operator_managed_cache_informers_total >= 1"#.to_owned(),
        format!(
            r#"package_operator_package_revision{{pko_name="{name}",pko_namespace="{hcp0}"}} == 1"#
        ),
    ] {
        wait_until(&expr, TIMEOUT, || async {
            match prometheus.query(&expr).await?.len() {
                0 => Err("no series".to_owned()),
                _ => Ok(()),
            }
        })
        .await
        .unwrap();
    }

    // pko's own series pass `promtool check metrics`; upstream's gauges named `..._total` are the one
    // exception, kept for dashboards written for the Go operator (docs/operations.md).
    let (_, exposition) = manager.get("/metrics").await.unwrap();
    let problems = promtool_metric_problems(&exposition);
    let ours: Vec<&String> = problems
        .iter()
        .filter(|p| !p.starts_with("package_operator_"))
        .collect();
    assert!(ours.is_empty(), "promtool check metrics: {ours:#?}");

    // Every query of the dashboard parses and has data to draw (run as its panels run them).
    let dashboard = Dashboard::load(&deploy_dir().join("monitoring/pko-dashboard.json")).unwrap();
    wait_until("every dashboard panel has data", TIMEOUT, || {
        dashboard.fetch(&prometheus, Duration::from_secs(600), true)
    })
    .await
    .unwrap();

    // The Events tell the rollout, once each, in order.
    let events: Api<KubeEvent> = Api::namespaced(client.clone(), "default");
    let reasons = wait_until("the rollout's Events", TIMEOUT, || async {
        let mut about: Vec<KubeEvent> = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref())
                        == Some("HostedClusterPackage")
            })
            .collect();
        about.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
        let told: Vec<String> = about
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.as_deref().unwrap_or(""),
                    e.note.as_deref().unwrap_or("")
                )
            })
            .collect();
        let reasons: Vec<String> = about.into_iter().filter_map(|e| e.reason).collect();
        if reasons.last().map(String::as_str) == Some("RolloutFinished") {
            Ok((reasons, told))
        } else {
            Err(format!("{reasons:?}"))
        }
    })
    .await
    .unwrap();
    let (reasons, mut told) = reasons;
    // What the Packages' namespaces were told meanwhile, to explain an unexpected step.
    for cluster in &clusters {
        let listed = Api::<KubeEvent>::namespaced(client.clone(), &cluster.hcp_namespace)
            .list(&ListParams::default())
            .await
            .unwrap();
        told.extend(listed.items.into_iter().map(|e| {
            format!(
                "{} {}/{}: {}: {}",
                cluster.hcp_namespace,
                e.regarding
                    .as_ref()
                    .and_then(|r| r.kind.clone())
                    .unwrap_or_default(),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.clone())
                    .unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        }));
    }
    assert_eq!(
        reasons,
        [
            "RolloutStarted",
            "PartitionStarted",
            "PartitionFinished",
            "RolloutFinished"
        ],
        "{told:#?}\n{}",
        manager.log_tail()
    );
    let package_events: Api<KubeEvent> =
        Api::namespaced(client.clone(), &clusters[0].hcp_namespace);
    let reasons: Vec<String> = package_events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    for reason in ["Unpacked", "NewRevision"] {
        assert_eq!(
            reasons.iter().filter(|r| *r == reason).count(),
            1,
            "one {reason} Event in {}: {reasons:?}",
            clusters[0].hcp_namespace
        );
    }
}

/// Verb, API group, resource (with `/subresource`), namespace, name.
type Access<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, Option<&'a str>);

/// One question to the apiserver's authorizer about the manager's ServiceAccount.
async fn allowed(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!(
                "system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
            )),
            groups: Some(vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{NAMESPACE}"),
                "system:authenticated".to_owned(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                namespace: namespace.map(str::to_owned),
                name: name.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

#[tokio::test]
async fn the_manager_role_allows_what_it_needs_and_nothing_more() {
    // No wildcard anywhere in the roles the manifests grant.
    for document in kustomize("manager").iter().map(|d| parsed(d)) {
        if !["ClusterRole", "Role"].contains(&document["kind"].as_str().unwrap()) {
            continue;
        }
        for rule in document["rules"].as_array().into_iter().flatten() {
            for field in ["verbs", "resources", "apiGroups"] {
                let values = rule[field].as_array().unwrap();
                assert!(
                    !values.iter().any(|v| v == "*"),
                    "{} {}: {rule}",
                    document["kind"],
                    document["metadata"]["name"]
                );
            }
        }
    }
    // The Deployment runs hardened, two replicas, probed and with requests.
    let container = manager_container();
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(container["resources"]["requests"]["memory"].is_string());
    let env_value = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(
        env_value("PKO_CONNECTOR_IMAGE"),
        Some(container["image"].clone())
    );

    // Only the metrics port takes connections.
    let policy = kustomize("manager")
        .iter()
        .map(|d| parsed(d))
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("a NetworkPolicy for the manager");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let ports: Vec<&Value> = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_array().unwrap())
        .map(|p| &p["port"])
        .collect();
    assert_eq!(ports, ["metrics"]);
    // From the monitoring namespaces only (issue 63, item 2): no rule without `from`.
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        let namespaces = &rule["from"][0]["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(namespaces["key"], "kubernetes.io/metadata.name", "{rule}");
        assert!(
            namespaces["values"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("monitoring")),
            "{rule}"
        );
        assert_eq!(rule["from"].as_array().unwrap().len(), 1, "{rule}");
    }
    // Drains take one replica at a time.
    let budget = kustomize("manager")
        .iter()
        .map(|d| parsed(d))
        .find(|d| d["kind"] == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget for the manager");
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "pko-manager"
    );

    install_manifests().await;
    let client = env().management().client().await.unwrap();
    let hcp = Some("clusters-example");
    let own = Some(NAMESPACE);
    let pko = "package-operator.run";
    let rbac = "rbac.authorization.k8s.io";
    let allowed_cases: &[Access] = &[
        ("patch", pko, "packages", hcp, None),
        (
            "update",
            pko,
            "hostedclusterpackages/status",
            None,
            Some("addon"),
        ),
        (
            "watch",
            "hypershift.openshift.io",
            "hostedclusters",
            None,
            None,
        ),
        ("create", "events.k8s.io", "events", hcp, None),
        // Whether HyperShift labelled a namespace as a hosted control plane's.
        ("get", "", "namespaces", None, Some("clusters-a")),
        ("patch", "", "configmaps", Some("anywhere"), Some("x")),
        ("patch", "apps", "deployments", hcp, Some("operator")),
        ("patch", "", "secrets", hcp, Some("pko-connector-nats")),
        // Creating cannot be limited by name in RBAC; it makes new Secrets only.
        ("create", "", "secrets", hcp, None),
        ("create", rbac, "rolebindings", hcp, None),
        ("patch", rbac, "roles", hcp, Some("pko-connector")),
        ("escalate", rbac, "roles", hcp, Some("pko-connector")),
        ("bind", rbac, "roles", hcp, Some("pko-connector")),
        (
            "update",
            "coordination.k8s.io",
            "leases",
            own,
            Some("pko-manager"),
        ),
    ];
    let denied_cases: &[Access] = &[
        ("patch", "", "secrets", hcp, Some("other")),
        ("get", "", "secrets", hcp, Some("other")),
        ("watch", "", "secrets", hcp, None),
        (
            "delete",
            "",
            "secrets",
            Some("kube-system"),
            Some("bootstrap-token"),
        ),
        ("list", "", "secrets", None, None),
        ("update", "", "secrets", own, Some("other")),
        ("create", rbac, "clusterroles", None, None),
        ("bind", rbac, "clusterroles", None, Some("cluster-admin")),
        ("escalate", rbac, "roles", hcp, Some("other")),
        ("patch", rbac, "rolebindings", hcp, Some("other")),
        ("create", rbac, "clusterrolebindings", None, None),
        // Acting as a ServiceAccount is the tenants install's (deploy/manager-tenants) alone.
        (
            "impersonate",
            "",
            "serviceaccounts",
            Some("tenant"),
            Some("deployer"),
        ),
        ("impersonate", "", "users", None, Some("admin")),
        ("impersonate", "", "groups", None, Some("system:masters")),
        ("create", "", "pods/exec", hcp, Some("x")),
        ("get", "", "nodes", None, None),
        (
            "update",
            "coordination.k8s.io",
            "leases",
            hcp,
            Some("pko-connector"),
        ),
        (
            "patch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            None,
            Some("packages.package-operator.run"),
        ),
        (
            "update",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            None,
            None,
        ),
        ("deletecollection", pko, "packages", hcp, None),
    ];
    let mut wrong = Vec::new();
    for (verb, group, resource, namespace, name) in allowed_cases {
        if !allowed(&client, verb, group, resource, *namespace, *name).await {
            wrong.push(format!(
                "denied but needed: {verb} {group}/{resource} {namespace:?} {name:?}"
            ));
        }
    }
    for (verb, group, resource, namespace, name) in denied_cases {
        if allowed(&client, verb, group, resource, *namespace, *name).await {
            wrong.push(format!(
                "allowed but not needed: {verb} {group}/{resource} {namespace:?} {name:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// What `promtool check metrics` says about `exposition`, one problem per line.
fn promtool_metric_problems(exposition: &str) -> Vec<String> {
    let out = run_with_input(
        Command::new("promtool").args(["check", "metrics"]),
        exposition,
    )
    .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty())
    .map(str::to_owned)
    .collect()
}

/// The alert rules load and their unit tests pass (`promtool`, from Debian's prometheus package).
#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let monitoring = deploy_dir().join("monitoring");
    for args in [
        ["check", "rules", "pko-alerts.yaml"],
        ["test", "rules", "pko-alerts-test.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&monitoring)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// deploy/manager-sharded is deploy/manager with every replica working on its share: three replicas
/// with --sharding (not --leader-election, which excludes it), and the RBAC sharding adds (member Leases
/// listed and renewed, patched with take-over records and deleted once retired, HostedClusters labelled).
/// The replicas are a StatefulSet's pods, each taking its pod name as its member name, so a restarted
/// pod takes its share back.
#[test]
fn the_sharded_install_runs_three_sharded_replicas_with_what_sharding_needs() {
    let documents: Vec<Value> = kustomize("manager-sharded")
        .iter()
        .map(|d| parsed(d))
        .collect();
    assert!(!documents.iter().any(|d| d["kind"] == "Deployment"));
    let replicas = documents
        .iter()
        .find(|d| d["kind"] == "StatefulSet" && d["metadata"]["name"] == "pko-manager")
        .unwrap();
    assert_eq!(replicas["spec"]["replicas"], 3);
    let container = &replicas["spec"]["template"]["spec"]["containers"][0];
    let member_name = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "PKO_MEMBER_NAME")
        .unwrap();
    assert_eq!(
        member_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--sharding"), "{args:?}");
    assert!(!args.contains(&"--leader-election"), "{args:?}");
    let rule_of = |kind: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == "pko-manager-sharding")
            .map(|d| d["rules"].clone())
            .unwrap()
    };
    assert_eq!(
        rule_of("Role")[0]["verbs"],
        serde_json::json!(["get", "list", "watch", "update", "patch", "delete"])
    );
    assert_eq!(
        rule_of("ClusterRole")[0]["resources"],
        serde_json::json!(["hostedclusters"])
    );
}

/// The sharded install's StatefulSet is one the apiserver takes (a server-side dry run against the
/// installed namespace and ServiceAccount): a kind changed by a patch keeps no Deployment-only field.
#[tokio::test]
async fn the_sharded_installs_statefulset_is_accepted_by_the_apiserver() {
    install_manifests().await;
    let replicas: Vec<String> = kustomize("manager-sharded")
        .into_iter()
        .filter(|d| parsed(d)["kind"] == "StatefulSet")
        .collect();
    assert_eq!(replicas.len(), 1);
    let out = kubectl_apply(&["--dry-run=server"], &replicas[0]);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("statefulset.apps/pko-manager serverside-applied (server dry run)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Applies deploy/manager-admission once; `None` where ValidatingAdmissionPolicy is not served (before
/// 1.30, the floor), else a client with the manager's ServiceAccount token.
async fn manager_under_admission_policies() -> Option<kube::Client> {
    static APPLIED: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    let served = *APPLIED
        .get_or_init(|| async {
            install_manifests().await;
            let admin = env().management().client().await.unwrap();
            let served = admin
                .list_api_group_resources("admissionregistration.k8s.io/v1")
                .await
                .is_ok_and(|l| {
                    l.resources
                        .iter()
                        .any(|r| r.name == "validatingadmissionpolicies")
                });
            if served {
                kubectl_apply(&[], &kustomize("manager-admission").join("\n---\n"));
            }
            served
        })
        .await;
    if !served {
        println!("ValidatingAdmissionPolicy not served here (before 1.30): nothing to check");
        return None;
    }
    let kubeconfig = env()
        .management()
        .service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)
        .await
        .unwrap();
    Some(
        kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(kubeconfig).unwrap(),
                &Default::default(),
            )
            .await
            .unwrap(),
        )
        .unwrap(),
    )
}

/// With deploy/manager-admission applied (Kubernetes 1.30+), the manager's own token cannot make a
/// ServiceAccount token Secret, although its RBAC creates Secrets anywhere and reads those named
/// pko-connector-nats (issue 63, item 11). On an older apiserver (the floor) the policies are not served.
#[tokio::test]
async fn the_manager_cannot_mint_a_token_for_another_service_account() {
    let Some(manager) = manager_under_admission_policies().await else {
        return;
    };
    let ns = env().management().create_namespace("mint").await.unwrap();
    let token: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pko-connector-nats",
            "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token",
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(manager, &ns);
    // The policy takes effect once the apiserver has loaded it: dry runs until it refuses.
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let refused = pko_testenv::wait_until("the token Secret refused", TIMEOUT, || async {
        match secrets.create(&dry_run, &token).await {
            Err(kube::Error::Api(e)) if e.message.contains("pko-manager-no-token-secrets") => {
                Ok(e.message)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    assert!(
        refused.contains("makes no ServiceAccount token Secrets"),
        "{refused}"
    );
    // The Secret it does make, a plain one of that name, is still taken.
    let plain: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pko-connector-nats"}, "stringData": {"creds": "x"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &plain)
        .await
        .unwrap();
}

/// With sharding's RBAC the manager may patch HostedClusters (its coordinator labels them with their
/// shard's owner); with deploy/manager-admission applied it changes nothing else on one: not the spec
/// (a release image for every hosted control plane), not another label, annotation or finalizer
/// (issue 63, item 11). The coordinator's own writes, a merge patch of both labels and the release's
/// JSON patch taking them off, still go through.
#[tokio::test]
async fn the_sharded_manager_changes_only_the_shard_labels_of_a_hosted_cluster() {
    use kube::api::{Patch, PatchParams};
    use pko_actors::runtime::kind_feed::shard_release::{remove_shard_labels, ReleaseOutcome};
    use pko_proto::hypershift::HostedCluster;
    let Some(manager) = manager_under_admission_policies().await else {
        return;
    };
    let rbac =
        std::fs::read_to_string(deploy_dir().join("manager-sharded/rbac-sharding.yaml")).unwrap();
    kubectl_apply(&[], &rbac);
    pko_testenv::install_hosted_cluster_crd(env().management())
        .await
        .unwrap();
    let admin = env().management().client().await.unwrap();
    let ns = env()
        .management()
        .create_namespace("shard-labels")
        .await
        .unwrap();
    let cluster: HostedCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": "hc", "namespace": ns, "labels": {"tier": "prod"}},
        "spec": {"release": {"image": "quay.io/openshift-release-dev/ocp-release:4.19.0"}},
    }))
    .unwrap();
    Api::<HostedCluster>::namespaced(admin, &ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let manager_client = manager.clone();
    let clusters: Api<HostedCluster> = Api::namespaced(manager, &ns);
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let refused = |patch: serde_json::Value| {
        let clusters = clusters.clone();
        let dry_run = dry_run.clone();
        async move {
            match clusters.patch("hc", &dry_run, &Patch::Merge(&patch)).await {
                Err(kube::Error::Api(e))
                    if e.message
                        .contains("pko-manager-hostedcluster-shard-labels-only") =>
                {
                    Ok(e.message)
                }
                other => Err(format!("{other:?}")),
            }
        }
    };
    // The policy takes effect once the apiserver has loaded it (and the role once bound): dry runs until
    // it refuses.
    let spec = serde_json::json!({"spec": {"release": {"image": "attacker.example/release:evil"}}});
    let message = wait_until("a spec change refused", TIMEOUT, || refused(spec.clone()))
        .await
        .unwrap();
    assert!(
        message.contains("changes no HostedCluster spec"),
        "{message}"
    );
    for patch in [
        serde_json::json!({"metadata": {"labels": {"tier": "canary"}}}),
        serde_json::json!({"metadata": {"labels": {"tier": null}}}),
        serde_json::json!({"metadata": {"annotations": {"hypershift.openshift.io/pause": "true"}}}),
        serde_json::json!({"metadata": {"finalizers": ["attacker.example/hold"]}}),
    ] {
        refused(patch.clone())
            .await
            .unwrap_or_else(|e| panic!("{patch} was not refused: {e}"));
    }
    // The coordinator's writes: both labels by a merge patch, then off again by a tested JSON patch.
    let owner = "shard.package-operator.run/owner";
    let drain = "shard.package-operator.run/drain";
    clusters
        .patch(
            "hc",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {owner: "pko-manager-1", drain: "true"}}})),
        )
        .await
        .unwrap();
    let (resource, _) = kube::discovery::pinned_kind(
        &manager_client,
        &kube::api::GroupVersionKind::gvk("hypershift.openshift.io", "v1beta1", "HostedCluster"),
    )
    .await
    .unwrap();
    let dynamic: Api<kube::api::DynamicObject> =
        Api::namespaced_with(manager_client.clone(), &ns, &resource);
    assert_eq!(
        remove_shard_labels(&dynamic, "hc", Some("pko-manager-1"))
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
    let after = clusters.get("hc").await.unwrap();
    let labels = after.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.into_iter().collect::<Vec<_>>(),
        vec![("tier".to_owned(), "prod".to_owned())]
    );
}

/// The tenants install grants impersonation of ServiceAccounts, and only it runs the manager with
/// --default-service-account: the plain install's manager impersonates nobody (issue 63, item 6).
#[test]
fn only_the_tenants_install_impersonates() {
    let impersonates = |dir: &str| {
        kustomize(dir)
            .iter()
            .map(|d| parsed(d))
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .any(|rule| {
                rule["verbs"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == "impersonate" || v == "*"))
            })
    };
    let flagged = |dir: &str| {
        common::shipped::manager_container_of(dir)["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| {
                a.as_str()
                    .unwrap()
                    .starts_with("--default-service-account=")
            })
    };
    assert!(!impersonates("manager") && !flagged("manager"));
    assert!(!impersonates("manager-sharded") && !flagged("manager-sharded"));
    assert!(impersonates("manager-tenants") && flagged("manager-tenants"));
    let rules: Vec<Value> = kustomize("manager-tenants")
        .iter()
        .map(|d| parsed(d))
        .filter(|d| {
            d["metadata"]["name"] == "pko-manager-impersonation" && d["kind"] == "ClusterRole"
        })
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        rules,
        [
            serde_json::json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]})
        ]
    );
}

/// The network policies (the shipped ingress one, and the egress example for sinks) are ones the
/// apiserver takes.
#[tokio::test]
async fn the_network_policies_are_accepted_by_the_apiserver() {
    install_manifests().await;
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/manager/examples/egress-network-policy.yaml"),
    )
    .unwrap();
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/manager/network-policy.yaml"),
    )
    .unwrap();
    for (name, policy) in [("pko-manager-egress", example), ("pko-manager", shipped)] {
        let out = kubectl_apply(&["--dry-run=server"], &policy);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!(
                "networkpolicy.networking.k8s.io/{name} serverside-applied (server dry run)"
            )),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The shipped namespace enforces the restricted Pod Security Standard, as upstream's own namespace
/// does (its restricted-policy test), and the shipped manager meets it: its ReplicaSet's pods are
/// admitted there while a plain pod is refused.
#[tokio::test]
async fn the_shipped_namespace_admits_only_restricted_pods_and_the_manager_is_one() {
    install_manifests().await;
    let client = env().management().client().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let plain: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "testing-policy-pod"},
        "spec": {"containers": [{"name": "c", "image": "registry.example/nginx:1"}]},
    }))
    .unwrap();
    let refused = pods
        .create(&PostParams::default(), &plain)
        .await
        .expect_err("a pod that is not restricted");
    assert!(
        refused
            .to_string()
            .contains(r#"violates PodSecurity "restricted:latest""#),
        "{refused}"
    );
    let listed = ListParams::default().labels("app.kubernetes.io/name=pko-manager");
    wait_until("the manager's pods admitted", TIMEOUT, || async {
        let found = pods.list(&listed).await.map_err(|e| e.to_string())?;
        if found.items.is_empty() {
            let events = Api::<KubeEvent>::namespaced(client.clone(), NAMESPACE)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let notes: Vec<_> = events.items.into_iter().filter_map(|e| e.note).collect();
            Err(format!("no pod yet; events {notes:?}"))
        } else {
            Ok(())
        }
    })
    .await
    .unwrap();
}
