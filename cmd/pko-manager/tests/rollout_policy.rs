//! The rollout policy (pko extension `spec.rolloutPolicy`) on the real environment: a soak holds the
//! next group for at least its time and an approval given for an older template does not count; a
//! Package that never gets live trips its progress deadline and, with `maxFailures: 0` and automatic
//! rollback, the fleet returns to the last good template; a Prometheus health check that goes bad during
//! a soak halts the rollout, and `kubectl package rollout undo` rolls it back; maintenance windows hold
//! a group and pause its soak and deadlines, and a skipped cluster holds nothing until its expiry. One
//! manager, pointed at a real Prometheus that scrapes a gauge this binary serves, is shared by the tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener as StdListener;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_testenv::{shared, wait_until, ManagerProcess, Prometheus};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::rollout::*;
use common::*;

/// Error ratios by fleet namespace, served as `pko_test_error_ratio{fleet="…"}`.
fn ratios() -> &'static Mutex<BTreeMap<String, f64>> {
    static RATIOS: OnceLock<Mutex<BTreeMap<String, f64>>> = OnceLock::new();
    RATIOS.get_or_init(Default::default)
}

/// A scrape target serving [`ratios`] on a loopback port, in a thread of its own.
fn serve_ratios() -> u16 {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = conn.read(&mut request).await;
                    let body: String = ratios()
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|(fleet, v)| format!("pko_test_error_ratio{{fleet=\"{fleet}\"}} {v}\n"))
                        .collect();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(response.as_bytes()).await;
                });
            }
        });
    });
    port
}

/// A registry that accepts connections and never answers: a pull from it hangs.
fn silent_registry() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming().flatten() {
                held.push(conn);
            }
        });
        port
    })
}

struct Shared {
    manager: ManagerProcess,
    prometheus: Prometheus,
}

/// The environment, a Prometheus scraping the ratios every second, and a manager querying it.
fn shared_env() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let env = shared().unwrap();
                let port = serve_ratios();
                let prometheus = Prometheus::start(
                    &env.root_dir().join("rollout-policy-prometheus"),
                    "ratios",
                    &[format!("127.0.0.1:{port}")],
                    &[],
                    Duration::from_secs(1),
                )
                .await
                .unwrap();
                let url = prometheus.url();
                let manager = env
                    .start_manager(
                        Path::new(env!("CARGO_BIN_EXE_pko-manager")),
                        // A release whose registry never answers is left unchecked by its preflight
                        // soon, so the deadline test's rollout starts within its wait.
                        &[
                            "--prometheus-url",
                            &url,
                            "--preflight-pull-timeout-seconds",
                            "2",
                        ],
                    )
                    .await
                    .unwrap();
                Shared {
                    manager,
                    prometheus,
                }
            })
        })
        .join()
        .unwrap()
    })
}

fn log() -> String {
    shared_env().manager.log_tail()
}

/// A fleet of `groups` (cluster counts in order) and a HostedClusterPackage over it with `policy`,
/// rolled out with `greeting` until it finished everywhere (its template is then the last good one).
async fn rollout(
    prefix: &str,
    groups: &[(&str, usize)],
    max_unavailable: Value,
    policy: Value,
) -> (
    Api<HostedClusterPackage>,
    Client,
    String,
    Vec<(String, String)>,
) {
    shared_env();
    let client = env().management().client().await.unwrap();
    let risks: Vec<Option<&str>> = groups
        .iter()
        .flat_map(|(g, n)| std::iter::repeat_n(Some(*g), *n))
        .collect();
    let (fleet_ns, clusters) = fleet(prefix, &risks).await;
    let image = build_and_push("handlebars", &format!("{prefix}:1"));
    let name = format!("{fleet_ns}-rollout");
    let order: Vec<&str> = groups.iter().map(|(g, _)| *g).collect();
    let mut h = hcpkg(
        &name,
        &fleet_ns,
        &image,
        json!({"rollingUpgrade": {"maxUnavailable": max_unavailable}}),
        Some(json!({"labelKey": "risk", "order": {"static": order}})),
    );
    h.spec.rollout_policy = Some(serde_json::from_value(policy).unwrap());
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    api.create(&PostParams::default(), &h).await.unwrap();
    wait_status(&api, &name, log, "the first template succeeded", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.last_succeeded.is_some() && s.counts.available_packages == risks.len() as i32
        })
    })
    .await;
    let members = clusters
        .iter()
        .zip(&risks)
        .map(|(c, r)| (c.hcp_namespace.clone(), r.unwrap().to_owned()))
        .collect();
    (api, client, name, members)
}

async fn set_template(api: &Api<HostedClusterPackage>, name: &str, spec: Value) {
    let patch = json!({"spec": {"template": {"spec": spec}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The hash of the last template that finished rolling out everywhere.
fn last_good_hash(h: &HostedClusterPackage) -> String {
    let status = h.status.as_ref().unwrap();
    status
        .last_succeeded
        .as_ref()
        .unwrap()
        .template_hash
        .clone()
}

/// The same image with another greeting: a new template that rolls out as fast as the first.
async fn set_greeting(
    api: &Api<HostedClusterPackage>,
    current: &HostedClusterPackage,
    greeting: &str,
) {
    let name = current.metadata.name.as_deref().unwrap();
    let image = &current.spec.template.spec.image;
    set_template(
        api,
        name,
        json!({"image": image, "config": {"greeting": greeting}}),
    )
    .await;
}

async fn greeting(client: &Client, namespace: &str, name: &str) -> String {
    let p = Api::<Package>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap();
    p.spec.config.unwrap_or_default()["greeting"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn time(text: &str) -> Timestamp {
    text.parse().unwrap()
}

/// A release of `good`'s image that fails in `namespace` alone: it adds the region `taken`, whose
/// ConfigMap that namespace already has, owned by nobody. Returns the template's spec.
async fn release_failing_in(
    client: &Client,
    good: &HostedClusterPackage,
    namespace: &str,
) -> Value {
    let name = good.metadata.name.as_deref().unwrap();
    let taken: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-region-taken")}, "data": {"owner": "someone else"},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &taken)
        .await
        .unwrap();
    let image = &good.spec.template.spec.image;
    json!({"image": image, "config": {"greeting": "v2", "regions": ["eu", "us", "taken"]}})
}

/// Observes the rollout of `release` (a template spec) over `members` in groups `early` then `late`.
async fn observe_release(
    client: &Client,
    name: &str,
    members: &[(String, String)],
    release: &Value,
) -> RolloutObserver {
    let group_of: BTreeMap<String, usize> = members
        .iter()
        .map(|(ns, g)| (ns.clone(), usize::from(g == "late")))
        .collect();
    let package_spec = json!({"image": release["image"], "config": release["config"]});
    RolloutObserver::start(client, name, &package_spec, group_of).await
}

/// Waits until `namespace`'s Package is strictly live on `good`'s template; returns it.
async fn live_on_good_template(
    client: &Client,
    good: &HostedClusterPackage,
    namespace: &str,
) -> Package {
    let name = good.metadata.name.as_deref().unwrap();
    wait_until(
        &format!("{namespace} live on the good template"),
        TIMEOUT,
        || async {
            let p = Api::<Package>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            if p.spec.config == good.spec.template.spec.config && is_done(&p) {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status.map(|s| s.conditions)))
            }
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_soak_holds_the_next_group_and_approvals_bind_to_their_template() {
    let soak = 6;
    let (api, client, name, members) = rollout(
        "policy-soak",
        &[("early", 1), ("late", 1)],
        json!(1),
        json!({"defaults": {"minSuccessTime": format!("{soak}s")},
               "groups": [{"name": "late", "requireApproval": true}]}),
    )
    .await;
    // An approval of the first template, which must not count for the next.
    let first = api.get(&name).await.unwrap();
    let old_hash = last_good_hash(&first);
    let target = format!("hostedclusterpackage/{name}");
    let approve_late = || cli(&["rollout", "approve", &target, "--group", "late"]);
    // The first template was created everywhere, never updated: it has no preflight to name.
    cli(&[
        "rollout",
        "approve",
        &target,
        "--group",
        "late",
        "--any-change",
    ]);
    let approved = api.get(&name).await.unwrap();
    let annotation = &approved.metadata.annotations.unwrap()
        [pko_proto::well_known::ROLLOUT_APPROVALS_ANNOTATION];
    assert!(annotation.contains(&old_hash), "{annotation}");

    set_greeting(&api, &first, "v2").await;
    let h = wait_status(&api, &name, log, "late awaits approval", |h| {
        condition(h, "AwaitingApproval").is_some_and(|c| c.status == "True")
    })
    .await;
    let status = h.status.clone().unwrap();
    let early = &status.partitions[0];
    assert_eq!(early.state, "Finished");
    let done_since = time(early.done_since.as_deref().unwrap());
    let waiting_since = condition(&h, "AwaitingApproval")
        .unwrap()
        .last_transition_time
        .0;
    assert!(
        waiting_since.duration_since(done_since).as_secs() >= soak,
        "late became next {waiting_since} only {}s after early was done at {done_since}",
        waiting_since.duration_since(done_since).as_secs()
    );
    assert_eq!(status.partitions[1].state, "AwaitingApproval");
    let late_ns = &members.iter().find(|(_, g)| g == "late").unwrap().0;
    assert_eq!(
        greeting(&client, late_ns, &name).await,
        "hi",
        "the old approval let late go"
    );
    let events = rollout_events(&name).await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "groupAwaitingApproval" && e["group"] == "late"),
        "no groupAwaitingApproval event among {events:?}"
    );

    approve_late();
    wait_status(&api, &name, log, "the approved template everywhere", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.counts.updated_packages == 2
                && s.counts.available_packages == 2
                && s.last_succeeded
                    .as_ref()
                    .is_some_and(|l| l.template_hash != old_hash)
        })
    })
    .await;
    assert_eq!(greeting(&client, late_ns, &name).await, "v2");
}

#[tokio::test]
async fn a_missed_deadline_rolls_the_fleet_back_to_the_last_good_template() {
    let (api, client, name, members) = rollout(
        "policy-deadline",
        &[("early", 2), ("late", 1)],
        json!(1),
        json!({"defaults": {"progressDeadline": "5s", "maxFailures": 0}, "rollback": "Automatic"}),
    )
    .await;
    let good = api.get(&name).await.unwrap();
    let good_hash = last_good_hash(&good);
    // An image whose registry never answers: its Package stays in flight, never failing by itself.
    let hanging = format!("127.0.0.1:{}/never:1", silent_registry());
    set_template(
        &api,
        &name,
        json!({"image": hanging, "config": {"greeting": "v2"}}),
    )
    .await;
    let h = wait_status(&api, &name, log, "rolled back", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.halted
                .as_ref()
                .is_some_and(|h| h.rolled_back_at.is_some())
                && s.counts.available_packages == 3
        })
    })
    .await;
    let status = h.status.clone().unwrap();
    let halted = status.halted.clone().unwrap();
    assert_eq!(halted.reason, "MaxFailuresExceeded");
    assert!(
        halted
            .message
            .contains("not live within progressDeadline 5s"),
        "{}",
        halted.message
    );
    let c = condition(&h, "Halted").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "MaxFailuresExceeded")
    );
    assert!(
        c.message
            .contains(&format!("Rolled back to template {good_hash}")),
        "{}",
        c.message
    );
    for (ns, _) in &members {
        let p = Api::<Package>::namespaced(client.clone(), ns)
            .get(&name)
            .await
            .unwrap();
        assert_eq!(
            p.spec.image, good.spec.template.spec.image,
            "{ns} is not back on the good image"
        );
    }
    let late_ns = &members.iter().find(|(_, g)| g == "late").unwrap().0;
    assert_eq!(greeting(&client, late_ns, &name).await, "hi");
    let kinds: Vec<Value> = rollout_events(&name)
        .await
        .into_iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert!(
        kinds.contains(&json!("rolloutHalted")) && kinds.contains(&json!("rollbackFinished")),
        "{kinds:?}"
    );
    // The halted template is not tried again while the spec stays.
    let generation = h.metadata.generation;
    let again = api.get(&name).await.unwrap();
    assert_eq!(again.metadata.generation, generation);
    assert!(again.status.unwrap().processing.is_empty());

    // A new template ends the halt: the stored status says so, not only the Halted condition (a merge
    // patch of the new status alone kept the old halt, and a later halt inherited its rolledBackAt:
    // chaos seed 3).
    set_greeting(&api, &good, "v3").await;
    let done = wait_status(&api, &name, log, "the next template rolled out", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.last_succeeded
                .as_ref()
                .is_some_and(|l| l.template_hash != good_hash)
                && s.counts.available_packages == 3
        })
    })
    .await;
    assert_eq!(done.status.unwrap().halted, None, "the ended halt stayed");
}

#[tokio::test]
async fn a_health_check_that_goes_bad_during_the_soak_halts_until_undone() {
    let fleet_label = "policy-health";
    let (api, client, name, members) = rollout(
        fleet_label,
        &[("early", 1), ("late", 1)],
        json!("50%"),
        json!({"defaults": {"minSuccessTime": "15s", "healthChecks": [{
            "name": "errors", "max": 0.1,
            "query": "max(pko_test_error_ratio{fleet=~\"policy-health.*\"}) or vector(0)"}]}}),
    )
    .await;
    let first = api.get(&name).await.unwrap();
    let good_hash = last_good_hash(&first);
    assert!(
        first.status.clone().unwrap().partitions[0]
            .health_checks
            .iter()
            .any(|c| c.state == "Passing"),
        "the first soak passed on an evaluated check"
    );
    set_greeting(&api, &first, "v2").await;
    wait_status(&api, &name, log, "early soaks", |h| {
        h.status
            .as_ref()
            .is_some_and(|s| s.partitions[0].state == "Soaking")
    })
    .await;
    ratios().lock().unwrap().insert(fleet_label.to_owned(), 0.5);
    // Prometheus sees it before the manager's next evaluation can.
    wait_until_prometheus_sees(0.5).await;
    let h = wait_status(&api, &name, log, "halted by the health check", |h| {
        h.status.as_ref().is_some_and(|s| s.halted.is_some())
    })
    .await;
    let halted = h.status.clone().unwrap().halted.unwrap();
    assert_eq!(halted.reason, "HealthCheckFailed");
    assert!(
        halted.message.contains("0.5 above max 0.1"),
        "{}",
        halted.message
    );
    assert!(!halted.rolling_back, "rollback is manual by default");
    let late_ns = &members.iter().find(|(_, g)| g == "late").unwrap().0;
    assert_eq!(
        greeting(&client, late_ns, &name).await,
        "hi",
        "late got the halted template"
    );

    let out = cli(&["rollout", "undo", &format!("hostedclusterpackage/{name}")]);
    assert!(out.contains(&format!("back to {good_hash}")), "{out}");
    wait_status(&api, &name, log, "rolled back by undo", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.halted
                .as_ref()
                .is_some_and(|h| h.rolled_back_at.is_some())
        })
    })
    .await;
    let early_ns = &members.iter().find(|(_, g)| g == "early").unwrap().0;
    assert_eq!(greeting(&client, early_ns, &name).await, "hi");
    let (ok, status) = run_cli(&[
        "rollout",
        "status",
        &format!("hostedclusterpackage/{name}"),
        "--watch=false",
    ]);
    assert!(!ok, "a halted rollout is not a success: {status}");
    assert!(status.contains("Halted (HealthCheckFailed)"), "{status}");
    let (_, metrics) = shared_env().manager.get("/metrics").await.unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("pko_hostedclusterpackage_health_checks_total")
                && l.contains(&name)
                && l.contains("failing")
        ),
        "no failing health check counted"
    );
}

async fn wait_until_prometheus_sees(value: f64) {
    let prometheus = &shared_env().prometheus;
    pko_testenv::wait_until("Prometheus scrapes the new ratio", TIMEOUT, || async {
        let samples = prometheus
            .query("max(pko_test_error_ratio{fleet=~\"policy-health.*\"})")
            .await?;
        samples
            .iter()
            .any(|s| s.value == value)
            .then_some(())
            .ok_or_else(|| format!("{samples:?}"))
    })
    .await
    .unwrap();
}

/// A release broken on one early cluster (a ConfigMap it must create there belongs to someone else): the
/// rollout halts, and the automatic rollback brings every Package back to the last good template and
/// live, the failed one included (its deployment makes a new revision of the old template that takes
/// the objects back), never with more than maxUnavailable Packages not live at once, counting the failed
/// one (issue 38, items 6 and 7).
#[tokio::test]
async fn a_rollback_brings_the_failed_cluster_back_within_the_budget() {
    let (api, client, name, members) = rollout(
        "policy-rollback",
        &[("early", 4), ("late", 1)],
        json!(2),
        json!({"defaults": {"progressDeadline": "60s", "maxFailures": 0}, "rollback": "Automatic"}),
    )
    .await;
    let good = api.get(&name).await.unwrap();
    let broken_ns = &members.iter().find(|(_, g)| g == "early").unwrap().0;
    let v2 = release_failing_in(&client, &good, broken_ns).await;
    let observer = observe_release(&client, &name, &members, &v2).await;
    set_template(&api, &name, v2).await;
    let h = wait_status(&api, &name, log, "rolled back, every Package live", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.halted
                .as_ref()
                .is_some_and(|h| h.rolled_back_at.is_some())
                && s.counts.available_packages == 5
        })
    })
    .await;
    assert_eq!(
        h.status.unwrap().halted.unwrap().reason,
        "MaxFailuresExceeded"
    );
    // Strictly live on the good template, the failed cluster included.
    for (ns, _) in &members {
        let p = live_on_good_template(&client, &good, ns).await;
        assert_eq!(p.spec.image, good.spec.template.spec.image);
    }
    assert_eq!(greeting(&client, broken_ns, &name).await, "hi");
    observer.observed.lock().unwrap().assert_within_budget(2);
}

/// Found by the chaos run (issue 41, seed 2): a HostedCluster that joined a later group while a release
/// was on trial (failing) in the first group got that release at once. It gets the last template that
/// finished everywhere, and the new one only when its group's turn comes.
#[tokio::test]
async fn a_cluster_joining_a_later_group_gets_the_last_good_template_until_its_turn() {
    let (api, client, name, members) = rollout(
        "policy-join",
        &[("early", 1), ("late", 1)],
        json!(1),
        json!({}),
    )
    .await;
    let good = api.get(&name).await.unwrap();
    let early = &members.iter().find(|(_, g)| g == "early").unwrap().0;
    // v2 fails in the early cluster, and the early group stays on trial.
    let v2 = release_failing_in(&client, &good, early).await;
    set_template(&api, &name, v2).await;
    wait_status(&api, &name, log, "v2 failing in the early group", |h| {
        h.status
            .as_ref()
            .is_some_and(|s| s.counts.failed_packages == 1)
    })
    .await;
    // A cluster joins the late group meanwhile.
    let fleet_ns = name.trim_end_matches("-rollout");
    let labels = BTreeMap::from([
        ("fleet".to_owned(), fleet_ns.to_owned()),
        ("risk".to_owned(), "late".to_owned()),
    ]);
    let joined = env()
        .add_hosted_cluster(fleet_ns, "hc-joined", labels, true)
        .await
        .unwrap();
    let packages = Api::<Package>::namespaced(client.clone(), &joined.hcp_namespace);
    wait_until("the joined cluster's Package", TIMEOUT, || async {
        packages
            .get_opt(&name)
            .await
            .map_err(|e| e.to_string())?
            .map(drop)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await
    .unwrap();
    assert_eq!(greeting(&client, &joined.hcp_namespace, &name).await, "hi");
    // A v3 without the taken region rolls out in the early group, then the late group's turn brings it
    // to the joined cluster too.
    set_template(
        &api,
        &name,
        json!({"image": good.spec.template.spec.image, "config": {"greeting": "v3", "regions": ["eu", "us"]}}),
    )
    .await;
    wait_status(&api, &name, log, "v3 everywhere", |h| {
        h.status
            .as_ref()
            .is_some_and(|s| s.counts.updated_packages == 3 && s.counts.available_packages == 3)
    })
    .await;
    assert_eq!(greeting(&client, &joined.hcp_namespace, &name).await, "v3");
}

/// Every create and update of a Package in `namespace` refused by the apiserver, the way a webhook
/// that cannot be reached refuses them (failing closed): one nobody serves, for that namespace alone.
/// Returns once the apiserver applies it; deleting the configuration it names ends it.
async fn refuse_package_writes(client: &Client, namespace: &str, package: &str) -> String {
    let label = "pko-test/refuse-package-writes";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {label: "true"}}})),
        )
        .await
        .unwrap();
    let name = format!("refuse-packages-{namespace}");
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "refuse.packages.pko.test",
            "clientConfig": {"url": "https://127.0.0.1:1/refuse"},
            "rules": [{"apiGroups": ["package-operator.run"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["packages"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {label: "true"}},
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }],
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    // The apiserver takes it from its own watch: a dry-run update tells when it does.
    let packages = Api::<Package>::namespaced(client.clone(), namespace);
    let probe = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let touch = json!({"metadata": {"annotations": {"pko-test/probe": "refused?"}}});
    wait_until("the webhook refuses Package writes", TIMEOUT, || async {
        match packages.patch(package, &probe, &Patch::Merge(&touch)).await {
            Err(e) if e.to_string().contains("refuse.packages.pko.test") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    name
}

/// Found reading the HostedClusterPackage supervisor (issue 41): a Package write that failed was
/// forgotten by the supervisor, which then planned the Package as it was last seen, while the
/// namespace's writer kept retrying it. A write of a release that was then rolled back landed once the
/// apiserver took it again: the broken release after its rollback, outside the budget. A retried write
/// stays counted as on its way, and the rollback replaces it.
#[tokio::test]
async fn a_retried_write_of_a_rolled_back_release_never_lands() {
    let (api, client, name, members) = rollout(
        "policy-retried",
        &[("early", 2), ("late", 1)],
        json!(2),
        json!({"defaults": {"maxFailures": 0}, "rollback": "Automatic"}),
    )
    .await;
    let good = api.get(&name).await.unwrap();
    let early: Vec<&String> = members
        .iter()
        .filter(|(_, g)| g == "early")
        .map(|(ns, _)| ns)
        .collect();
    let (broken_ns, refused_ns) = (early[0], early[1]);
    let v2 = release_failing_in(&client, &good, broken_ns).await;
    // The other early cluster's Package cannot be written until the webhook goes.
    let refused = Api::<Package>::namespaced(client.clone(), refused_ns);
    let generation = refused.get(&name).await.unwrap().metadata.generation;
    let webhook = refuse_package_writes(&client, refused_ns, &name).await;
    let observer = observe_release(&client, &name, &members, &v2).await;
    set_template(&api, &name, v2).await;
    // v2 fails where its region is taken, and the fleet goes back to the good template there, while
    // the write to the refused cluster keeps failing.
    let failing = |h: &HostedClusterPackage| {
        condition(h, "Progressing").is_some_and(|c| {
            c.message.contains("Failing, retried with backoff") && c.message.contains(refused_ns)
        })
    };
    let halted = wait_status(
        &api,
        &name,
        log,
        "rolling back, the refused write named",
        |h| {
            h.status
                .as_ref()
                .is_some_and(|s| s.halted.as_ref().is_some_and(|h| h.rolling_back))
                && failing(h)
        },
    )
    .await;
    live_on_good_template(&client, &good, broken_ns).await;
    // A write on its way may still land: the rollback is not complete while it is.
    let h = api.get(&name).await.unwrap();
    assert!(
        failing(&h)
            && h.status
                .as_ref()
                .unwrap()
                .halted
                .as_ref()
                .unwrap()
                .rolled_back_at
                .is_none(),
        "{:?}\nhalted at: {:?}",
        h.status,
        halted.status.map(|s| s.halted)
    );
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(&webhook, &Default::default())
        .await
        .unwrap();
    wait_status(&api, &name, log, "rolled back, nothing failing", |h| {
        h.status.as_ref().is_some_and(|s| {
            s.halted
                .as_ref()
                .is_some_and(|h| h.rolled_back_at.is_some())
                && s.counts.available_packages == 3
        }) && !failing(h)
    })
    .await;
    // The refused write was never v2's: the Package kept its spec and generation.
    let p = refused.get(&name).await.unwrap();
    assert_eq!(p.metadata.generation, generation);
    assert_eq!(p.spec.config, good.spec.template.spec.config);
    let observed = observer.observed.lock().unwrap();
    assert!(
        !observed.update_order.contains(refused_ns),
        "{refused_ns} took the rolled-back release:\n{}",
        observed.timeline.join("\n")
    );
    observed.assert_within_budget(2);
}

/// Labels HostedCluster `hc-NN` of the fleet behind HostedClusterPackage `name` with maintenance window
/// `window`.
async fn name_window(client: &Client, name: &str, cluster: &str, window: &str) {
    use pko_proto::hypershift::HostedCluster;
    let fleet_ns = name.trim_end_matches("-rollout");
    let patch =
        json!({"metadata": {"labels": {pko_proto::well_known::MAINTENANCE_WINDOW_LABEL: window}}});
    Api::<HostedCluster>::namespaced(client.clone(), fleet_ns)
        .patch(cluster, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A new policy and the next greeting in one write.
async fn set_policy_and_greeting(
    api: &Api<HostedClusterPackage>,
    current: &HostedClusterPackage,
    policy: Value,
    greeting: &str,
) {
    let name = current.metadata.name.as_deref().unwrap();
    let image = &current.spec.template.spec.image;
    let patch = json!({"spec": {"rolloutPolicy": policy,
        "template": {"spec": {"image": image, "config": {"greeting": greeting}}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// `at` as a daily six-field schedule (seconds first) in UTC: a window that opens once, at `at`, within
/// the test.
fn daily_at(at: Timestamp) -> String {
    let t = at.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    format!("{} {} {} * * *", t.second(), t.minute(), t.hour())
}

fn partition<'a>(
    h: &'a HostedClusterPackage,
    group: &str,
) -> Option<&'a pko_proto::core::hosted_cluster_package::HostedClusterPackagePartitionStatus> {
    h.status
        .as_ref()
        .and_then(|s| s.partitions.iter().find(|p| p.name == group))
}

/// Early's window opens 3 s of every 10, late's once, 40 s from now: early's 4 s soak counts only open
/// time (so it takes at least 10 s of wall time), then late waits for its window, says so with the
/// window's start, and is updated once it opens.
#[tokio::test]
async fn a_group_waits_for_its_window_and_its_soak_counts_only_open_time() {
    let (api, client, name, members) = rollout(
        "policy-window",
        &[("early", 1), ("late", 1)],
        json!(1),
        json!({}),
    )
    .await;
    name_window(&client, &name, "hc-00", "short").await;
    name_window(&client, &name, "hc-01", "later").await;
    let opens = Timestamp::from_second(Timestamp::now().as_second() + 40).unwrap();
    let policy = json!({
        "maintenanceWindows": [
            {"name": "short", "schedule": "*/10 * * * * *", "duration": "3s"},
            {"name": "later", "schedule": daily_at(opens), "duration": "1h"},
        ],
        "defaults": {"minSuccessTime": "4s"},
    });
    let current = api.get(&name).await.unwrap();
    set_policy_and_greeting(&api, &current, policy, "v2").await;

    let soaking = wait_status(&api, &name, log, "early soaks", |h| {
        partition(h, "early").is_some_and(|p| p.done_since.is_some())
    })
    .await;
    let done_since = time(
        partition(&soaking, "early")
            .unwrap()
            .done_since
            .as_deref()
            .unwrap(),
    );
    let waiting = wait_status(&api, &name, log, "late waits for its window", |h| {
        partition(h, "late").is_some_and(|p| p.state == "WaitingForWindow")
    })
    .await;
    let seen = Timestamp::now();
    assert!(
        seen.duration_since(done_since).as_secs() >= 9,
        "early's 4 s soak ended {}s after it was done at {done_since}: closed time counted",
        seen.duration_since(done_since).as_secs()
    );
    assert_eq!(partition(&waiting, "early").unwrap().state, "Finished");
    let late = partition(&waiting, "late").unwrap();
    assert_eq!(late.waiting_for_window, 1);
    assert_eq!(
        late.next_window_start.as_deref(),
        Some(opens.to_string().as_str())
    );
    let late_ns = &members.iter().find(|(_, g)| g == "late").unwrap().0;
    assert_eq!(greeting(&client, late_ns, &name).await, "hi");
    let status = cli(&["rollout", "status", &format!("hostedclusterpackage/{name}")]);
    assert!(
        status.contains(&format!(
            "1 waiting for their maintenance window, the first opens at {opens}"
        )),
        "{status}"
    );
    let events = rollout_events(&name).await;
    assert!(
        events.iter().any(|e| e["kind"] == "groupWaitingForWindow"
            && e["group"] == "late"
            && e["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&opens.to_string())),
        "no groupWaitingForWindow event among {events:?}"
    );

    wait_until("late updated in its window", TIMEOUT * 2, || async {
        match greeting(&client, late_ns, &name).await.as_str() {
            "v2" => Ok(()),
            other => Err(other.to_owned()),
        }
    })
    .await
    .unwrap();
    assert!(
        Timestamp::now() >= opens,
        "late was updated before its window opened at {opens}"
    );
    wait_status(&api, &name, log, "the release everywhere", |h| {
        all_available(h, 2)
    })
    .await;
}

/// A Package that never gets live, in a window open 2 s of every 5: its 3 s progress deadline counts
/// only open time, so it trips at least 5 s of wall time after the update (before the hanging pull gives
/// up on its own, after 10 s), which was written while the window was open.
#[tokio::test]
async fn a_progress_deadline_counts_only_open_time() {
    let (api, _client, name, _members) = rollout(
        "policy-window-deadline",
        &[("early", 1)],
        json!(1),
        json!({}),
    )
    .await;
    let client = env().management().client().await.unwrap();
    name_window(&client, &name, "hc-00", "brief").await;
    let hanging = format!("127.0.0.1:{}/never:1", silent_registry());
    let patch = json!({"spec": {
        "rolloutPolicy": {
            "maintenanceWindows": [{"name": "brief", "schedule": "*/5 * * * * *", "duration": "2s"}],
            "defaults": {"progressDeadline": "3s", "maxFailures": 0},
        },
        "template": {"spec": {"image": hanging, "config": {"greeting": "v2"}}},
    }});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let h = wait_status(&api, &name, log, "halted on the deadline", |h| {
        h.status.as_ref().is_some_and(|s| s.halted.is_some())
    })
    .await;
    let halted = h.status.unwrap().halted.unwrap();
    assert_eq!(halted.reason, "MaxFailuresExceeded");
    let updated_at = time(
        halted
            .message
            .split("of its update at ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|t| t.trim_end_matches(['.', ',', ';', ')']))
            .unwrap_or_else(|| panic!("no update time in {}", halted.message)),
    );
    let second = updated_at
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .second();
    assert!(
        second % 5 < 2,
        "updated at {updated_at}, outside its window"
    );
    let wall = time(&halted.halted_at).duration_since(updated_at).as_secs();
    assert!(
        wall >= 5,
        "the 3 s deadline tripped {wall}s after the update: closed time counted"
    );
}

/// A cluster left out until a moment 25 s from now: its group finishes without it and the next group
/// is updated, status lists it with its reason, and once the skip expires it is updated too.
#[tokio::test]
async fn a_skipped_cluster_holds_nothing_and_is_updated_after_its_expiry() {
    let (api, client, name, members) = rollout(
        "policy-skip",
        &[("early", 2), ("late", 1)],
        json!(1),
        json!({}),
    )
    .await;
    let skipped_ns = members[0].0.clone();
    let until = Timestamp::from_second(Timestamp::now().as_second() + 25).unwrap();
    let policy = json!({"skip": [{"namespaces": [skipped_ns], "until": until.to_string(),
        "reason": "customer freeze"}]});
    let current = api.get(&name).await.unwrap();
    let old_hash = last_good_hash(&current);
    set_policy_and_greeting(&api, &current, policy, "v2").await;
    let late_ns = &members.iter().find(|(_, g)| g == "late").unwrap().0;
    let h = wait_status(
        &api,
        &name,
        log,
        "late updated without the skipped cluster",
        |h| {
            h.status.as_ref().is_some_and(|s| {
                s.counts.updated_packages == 2
                    && s.counts.available_packages == 2
                    && s.counts.total_packages == 2
            })
        },
    )
    .await;
    assert_eq!(greeting(&client, late_ns, &name).await, "v2");
    assert_eq!(greeting(&client, &skipped_ns, &name).await, "hi");
    let status = h.status.unwrap();
    assert_eq!(status.skipped.len(), 1, "{:?}", status.skipped);
    assert_eq!(
        (
            status.skipped[0].namespace.as_str(),
            status.skipped[0].reason.as_str()
        ),
        (skipped_ns.as_str(), "customer freeze")
    );
    assert_eq!(status.counts.failed_packages, 0);
    assert_eq!(
        status.last_succeeded.map(|l| l.template_hash),
        Some(old_hash.clone()),
        "v2 did not finish everywhere while a cluster left out is on the old template"
    );
    assert!(
        Timestamp::now() < until,
        "the test was too slow to see the skip hold"
    );
    let events = rollout_events(&name).await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "packageSkipped" && e["namespace"] == skipped_ns.as_str()),
        "no packageSkipped event among {events:?}"
    );

    let done = wait_status(
        &api,
        &name,
        log,
        "the skipped cluster updated after its expiry",
        |h| {
            h.status.as_ref().is_some_and(|s| {
                s.skipped.is_empty() && all_available(h, 3) && s.counts.updated_packages == 3
            })
        },
    )
    .await;
    assert!(Timestamp::now() >= until);
    assert_eq!(greeting(&client, &skipped_ns, &name).await, "v2");
    assert_ne!(last_good_hash(&done), old_hash);
}

/// A HostedCluster's owner names a window the policy does not define, and the owners of a group that
/// needs an approval all leave it (issue 63, item 5): the first cluster is left out and listed, without
/// holding its group or the next; the emptied group still holds the groups after it until approved.
#[tokio::test]
async fn a_clusters_own_labels_neither_hold_nor_open_other_clusters_rollouts() {
    let (api, client, name, members) = rollout(
        "policy-unknown-window",
        &[("early", 2), ("mid", 1), ("late", 1)],
        json!(1),
        json!({}),
    )
    .await;
    // hc-00, hc-01 early; hc-02 mid; hc-03 late.
    name_window(&client, &name, "hc-00", "weekend").await;
    let policy = json!({
        "maintenanceWindows": [{"name": "always", "schedule": "* * * * *", "duration": "1h"}],
        "groups": [{"name": "mid", "requireApproval": true}],
        "skip": [{"namespaces": [members[2].0.clone()], "until": "2099-01-01T00:00:00Z",
            "reason": "customer freeze"}],
    });
    let current = api.get(&name).await.unwrap();
    set_policy_and_greeting(&api, &current, policy, "v2").await;
    let early_ns = &members[1].0;
    let unknown_ns = &members[0].0;
    let late_ns = &members[3].0;
    let h = wait_status(
        &api,
        &name,
        log,
        "early rolled without the cluster naming an undefined window",
        |h| {
            partition(h, "early").is_some_and(|p| p.state == "Finished")
                && partition(h, "mid").is_some_and(|p| p.state == "AwaitingApproval")
        },
    )
    .await;
    assert_eq!(greeting(&client, early_ns, &name).await, "v2");
    assert_eq!(greeting(&client, unknown_ns, &name).await, "hi");
    assert_eq!(
        greeting(&client, late_ns, &name).await,
        "hi",
        "late started although the emptied group mid awaits its approval"
    );
    let status = h.status.clone().unwrap();
    let unknown = status
        .skipped
        .iter()
        .find(|s| &s.namespace == unknown_ns)
        .unwrap_or_else(|| panic!("{unknown_ns} not listed: {:?}", status.skipped));
    assert_eq!(unknown.until, None);
    assert!(unknown.reason.contains("\"weekend\""), "{}", unknown.reason);
    let held = shared_env()
        .manager
        .metric(&format!(
            "pko_hostedclusterpackage_held_packages{{hostedclusterpackage=\"{name}\",state=\"unknown_window\"}}"
        ))
        .await
        .unwrap();
    assert_eq!(held, 1);
    let events = rollout_events(&name).await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "packageSkipped" && e["namespace"] == unknown_ns.as_str()),
        "no packageSkipped event among {events:?}"
    );

    // Approved: late goes on; the cluster naming the undefined window stays as it is.
    cli(&[
        "rollout",
        "approve",
        &format!("hostedclusterpackage/{name}"),
        "--group",
        "mid",
    ]);
    wait_until("late updated once mid is approved", TIMEOUT, || async {
        match greeting(&client, late_ns, &name).await.as_str() {
            "v2" => Ok(()),
            other => Err(other.to_owned()),
        }
    })
    .await
    .unwrap();
    assert_eq!(greeting(&client, unknown_ns, &name).await, "hi");
}
