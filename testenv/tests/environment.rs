//! The harness starts real servers that work: every apiserver stores and watches objects independently,
//! the controller manager collects garbage, JetStream stores and delivers, the registry stores blobs, and
//! servers never outlive the process that started them.

#![allow(clippy::unwrap_used)] // tests fail loudly on the first unexpected error

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use pko_testenv::{shared, wait_until, EnvConfig, TestEnv};

const DEADLINE: Duration = Duration::from_secs(30);

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some([("value".to_owned(), value.to_owned())].into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn every_apiserver_stores_and_watches_objects() {
    let env = shared().unwrap();
    let servers: Vec<_> = std::iter::once(env.management())
        .chain(env.hosted_clusters())
        .collect();
    assert_eq!(servers.len(), 3, "management plus two hosted clusters");
    for server in servers {
        let namespace = server.create_namespace("watch").await.unwrap();
        let config_maps: Api<ConfigMap> =
            Api::namespaced(server.client().await.unwrap(), &namespace);
        let mut events = watcher(config_maps.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        config_maps
            .create(
                &PostParams::default(),
                &config_map("written", server.name()),
            )
            .await
            .unwrap();
        let seen = tokio::time::timeout(DEADLINE, async {
            while let Some(object) = events.try_next().await.unwrap() {
                if object.metadata.name.as_deref() == Some("written") {
                    return object;
                }
            }
            panic!("watch ended");
        })
        .await
        .unwrap_or_else(|_| panic!("{} did not deliver the watch event", server.name()));
        assert_eq!(seen.data.unwrap()["value"], server.name());
    }
}

#[tokio::test]
async fn hosted_clusters_do_not_share_objects() {
    let env = shared().unwrap();
    let [first, second] = env.hosted_clusters() else {
        panic!("expected two hosted clusters");
    };
    let namespace = first.create_namespace("isolation").await.unwrap();
    let in_first: Api<ConfigMap> = Api::namespaced(first.client().await.unwrap(), &namespace);
    in_first
        .create(&PostParams::default(), &config_map("only-here", "first"))
        .await
        .unwrap();
    for other in [second, env.management()] {
        let api: Api<ConfigMap> = Api::namespaced(other.client().await.unwrap(), &namespace);
        assert!(
            api.get_opt("only-here").await.unwrap().is_none(),
            "{} sees an object written to {}",
            other.name(),
            first.name()
        );
    }
    assert_ne!(first.url(), second.url());
    assert_ne!(first.kubeconfig_path(), second.kubeconfig_path());
}

#[tokio::test]
async fn controller_manager_collects_garbage() {
    let env = shared().unwrap();
    assert!(env.has_controller_manager());
    let server = env.management();
    let namespace = server.create_namespace("gc").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client().await.unwrap(), &namespace);
    let owner = api
        .create(&PostParams::default(), &config_map("owner", "x"))
        .await
        .unwrap();
    let mut dependent = config_map("dependent", "y");
    dependent.metadata.owner_references = Some(vec![owner.controller_owner_ref(&()).unwrap()]);
    api.create(&PostParams::default(), &dependent)
        .await
        .unwrap();

    api.delete("owner", &DeleteParams::default()).await.unwrap();
    wait_until("dependent garbage-collected", DEADLINE, || {
        let api = api.clone();
        async move {
            match api.get_opt("dependent").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("dependent still exists".to_owned()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn jetstream_stores_and_delivers_a_message() {
    use async_nats::jetstream::{self, consumer::pull, stream};
    let env = shared().unwrap();
    let context = jetstream::new(env.nats().client().await.unwrap());
    let stream = context
        .create_stream(stream::Config {
            name: "harness-check".to_owned(),
            subjects: vec!["harness.check.>".to_owned()],
            ..Default::default()
        })
        .await
        .unwrap();
    let ack = context
        .publish("harness.check.one", "payload-1".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.stream, "harness-check");

    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("harness-reader".to_owned()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.fetch().max_messages(1).messages().await.unwrap();
    let message = tokio::time::timeout(DEADLINE, messages.next())
        .await
        .unwrap()
        .expect("one message")
        .unwrap();
    assert_eq!(message.subject.as_str(), "harness.check.one");
    assert_eq!(&message.payload[..], b"payload-1");
    message.ack().await.unwrap();
}

#[tokio::test]
async fn registry_stores_and_returns_a_blob() {
    use oci_client::client::{ClientConfig, ClientProtocol};
    use oci_client::{Client, Reference};
    let env = shared().unwrap();
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let reference: Reference = format!("{}/harness/blob:v1", env.registry().host())
        .parse()
        .unwrap();
    let data = b"pko harness blob".to_vec();
    let digest = format!("sha256:{}", sha256_hex(&data));
    client
        .push_blob(&reference, data.clone(), &digest)
        .await
        .unwrap();
    let mut pulled = Vec::new();
    client
        .pull_blob(&reference, digest.as_str(), &mut pulled)
        .await
        .unwrap();
    assert_eq!(pulled, data);
}

/// SHA-256 via the system's sha256sum, so the test does not pull in a hashing crate of its own.
fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8(output.stdout).unwrap()[..64].to_owned()
}

fn alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a killed but unreaped one is a zombie ("Z").
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.split_whitespace()
                .nth(2)
                .is_none_or(|state| state != "Z")
        })
        .unwrap_or(false)
}

const MINIMAL: EnvConfig = EnvConfig {
    hosted_clusters: 0,
    controller_manager: false,
};

#[tokio::test]
async fn dropping_an_environment_stops_its_servers_and_removes_its_files() {
    let env = TestEnv::start(MINIMAL).await.unwrap();
    let pids: Vec<u32> = env.processes().into_iter().map(|(_, pid)| pid).collect();
    let root = env.root_dir().to_owned();
    assert_eq!(
        pids.len(),
        5,
        "etcd, apiserver, nats-server, two registries"
    );
    assert!(pids.iter().all(|pid| alive(*pid)));
    drop(env);
    assert!(
        pids.iter().all(|pid| !alive(*pid)),
        "a server survived drop"
    );
    assert!(!root.exists(), "{} not removed", root.display());
}

/// A run that found something keeps its servers' logs for a look afterwards; the clean-up of dead
/// owners' directories a later environment does spares them.
#[tokio::test]
async fn kept_files_outlive_the_environment_and_the_next_clean_up() {
    let env = TestEnv::start(MINIMAL).await.unwrap();
    let root = env.keep_files().unwrap().to_owned();
    drop(env);
    assert!(root.join("etcd.log").exists(), "{} removed", root.display());
    // The owner is gone for the next environment's clean-up only once this process is; a directory
    // named for a dead pid stands in for it.
    let dead_owner = root.with_file_name("999999999-0");
    std::fs::rename(&root, &dead_owner).unwrap();
    let next = TestEnv::start(MINIMAL).await.unwrap();
    drop(next);
    assert!(
        dead_owner.join("etcd.log").exists(),
        "kept files cleaned up"
    );
    std::fs::remove_dir_all(&dead_owner).unwrap();
}

/// The stand-in workload controller reports each version of a Widget, also once it was deleted and made
/// again under its name (its generations start over): the chaos run's Package deletion fault left a
/// made-again Widget unreported, and its rollout halted on the harness's account.
#[tokio::test]
async fn the_workload_simulator_reports_a_widget_made_again_under_its_name() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use pko_testenv::workload::{
        install_widget_crd, widget_resource, WorkloadSimulator, WIDGET_GROUP,
    };

    let env = shared().unwrap();
    let client = env.management().client().await.unwrap();
    install_widget_crd(&client, WIDGET_GROUP).await.unwrap();
    let namespace = "simulated-widgets";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await;
    let _simulator = WorkloadSimulator::widgets(
        &client,
        [namespace.to_owned()].into(),
        Duration::from_millis(10),
    );
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &widget_resource());
    let apply = |release: &'static str| {
        let widgets = widgets.clone();
        async move {
            let widget = serde_json::json!({
                "apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "Widget",
                "metadata": {"name": "w"}, "spec": {"release": release},
            });
            let params = PatchParams::apply("environment-test").force();
            widgets
                .patch("w", &params, &Patch::Apply(&widget))
                .await
                .unwrap()
        }
    };
    let reported = |generation: i64| {
        let widgets = widgets.clone();
        async move {
            wait_until(
                &format!("generation {generation} reported"),
                DEADLINE,
                || {
                    let widgets = widgets.clone();
                    async move {
                        let w = widgets.get("w").await.map_err(|e| e.to_string())?;
                        let value = serde_json::to_value(&w).map_err(|e| e.to_string())?;
                        let observed = value.pointer("/status/conditions/0/observedGeneration");
                        if observed == Some(&serde_json::json!(generation)) {
                            Ok(())
                        } else {
                            Err(format!("status {:?}", value.get("status")))
                        }
                    }
                },
            )
            .await
            .unwrap();
        }
    };
    apply("r1").await;
    reported(1).await;
    apply("r2").await;
    reported(2).await;
    widgets.delete("w", &DeleteParams::default()).await.unwrap();
    wait_until("the Widget gone", DEADLINE, || {
        let widgets = widgets.clone();
        async move {
            match widgets.get_opt("w").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            }
        }
    })
    .await
    .unwrap();
    apply("r3").await;
    reported(1).await;
    apply("r4").await;
    reported(2).await;
}

const CRASH_CHILD: &str = "PKO_TESTENV_CRASH_CHILD";

/// Run by `servers_die_with_a_crashing_test_process` in a child process: starts servers, then aborts
/// without unwinding or running any destructor.
#[tokio::test]
#[ignore = "helper: runs only as the child of servers_die_with_a_crashing_test_process"]
async fn crashing_child() {
    if std::env::var_os(CRASH_CHILD).is_none() {
        return;
    }
    let env = TestEnv::start(MINIMAL).await.unwrap();
    let pids: Vec<String> = env
        .processes()
        .into_iter()
        .map(|(_, pid)| pid.to_string())
        .collect();
    println!("PIDS {}", pids.join(" "));
    std::process::abort();
}

#[tokio::test]
async fn servers_die_with_a_crashing_test_process() {
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crashing_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_CHILD, "1")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "the child was meant to abort");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let pids: Vec<u32> = stdout
        .lines()
        .find_map(|line| line.split_once("PIDS ").map(|(_, pids)| pids))
        .unwrap_or_else(|| {
            panic!(
                "child printed no PIDS line: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 5);
    wait_until("servers of the aborted process gone", DEADLINE, || {
        let survivors: Vec<u32> = pids.iter().copied().filter(|pid| alive(*pid)).collect();
        async move {
            if survivors.is_empty() {
                Ok(())
            } else {
                Err(format!("still running: {survivors:?}"))
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn simulated_hypershift_points_each_hosted_cluster_at_its_apiserver() {
    use k8s_openapi::api::core::v1::Secret;
    use pko_proto::hypershift::HostedCluster;
    let env = shared().unwrap();
    let simulated = env.simulate_hypershift().await.unwrap();
    assert_eq!(simulated.len(), 2);
    let management = env.management().client().await.unwrap();
    let hosted_clusters: Api<HostedCluster> =
        Api::namespaced(management.clone(), pko_testenv::HOSTED_CLUSTERS_NAMESPACE);
    for (cluster, server) in simulated.iter().zip(env.hosted_clusters()) {
        let object = hosted_clusters.get(&cluster.name).await.unwrap();
        assert!(object.is_available(), "{} not Available", cluster.name);
        assert_eq!(
            object.hosted_control_plane_namespace().as_deref(),
            Some(cluster.hcp_namespace.as_str())
        );

        // The Secret's kubeconfig reaches this hosted cluster's apiserver and no other.
        let secret = Api::<Secret>::namespaced(management.clone(), &cluster.hcp_namespace)
            .get(pko_testenv::KUBECONFIG_SECRET)
            .await
            .unwrap();
        let kubeconfig = kube::config::Kubeconfig::from_yaml(
            std::str::from_utf8(&secret.data.unwrap()["kubeconfig"].0).unwrap(),
        )
        .unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let through_secret = kube::Client::try_from(config).unwrap();
        let namespace = server.create_namespace("via-secret").await.unwrap();
        Api::<ConfigMap>::namespaced(through_secret, &namespace)
            .create(&PostParams::default(), &config_map("marker", &cluster.name))
            .await
            .unwrap();
        let direct: Api<ConfigMap> = Api::namespaced(server.client().await.unwrap(), &namespace);
        assert_eq!(
            direct.get("marker").await.unwrap().data.unwrap()["value"],
            cluster.name
        );
    }
    // Idempotent: a second run changes nothing and fails nothing.
    assert_eq!(env.simulate_hypershift().await.unwrap(), simulated);
}
