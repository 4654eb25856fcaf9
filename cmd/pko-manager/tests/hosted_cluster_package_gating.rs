//! HostedClusterPackage rollouts gated on the latest revision being live, with workloads that take about a
//! second to get ready after each change (a simulated controller writes their status; this binary's
//! environment runs no kube-controller-manager, so the test alone writes Deployment status), and in-place
//! updates, so each new revision takes the objects over
//! from the previous one. An independent observer of every Package change holds the rollout to the
//! strict definition (done = Available=True and Progressing=False, both for the Package's generation):
//! a healthy release respects budget and barrier and takes at least a readiness lag per wave; a release
//! broken on one first-group cluster never leaves that group, is named in status, Events and the event
//! stream, and a next healthy release completes everywhere.
#![allow(clippy::unwrap_used)]

mod common;

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_testenv::{shared_with, wait_until, EnvConfig};
use serde_json::{json, Value};

use common::rollout::*;
use common::workload::*;
use common::*;

const MAX_UNAVAILABLE: usize = 2;

/// Waves a rolling update needs: per group, its size over maxUnavailable, rounded up.
fn waves(group_of: &BTreeMap<String, usize>) -> u32 {
    let mut sizes = BTreeMap::<usize, usize>::new();
    for g in group_of.values() {
        *sizes.entry(*g).or_default() += 1;
    }
    sizes
        .values()
        .map(|n| n.div_ceil(MAX_UNAVAILABLE) as u32)
        .sum()
}

fn release_spec(image: &str, release: &str) -> Value {
    json!({"image": image, "config": {"release": release}})
}

/// Every Package on the current template and done, by pko's counts and by the strict definition.
async fn wait_all_done(api: &Api<HostedClusterPackage>, client: &Client, name: &str, total: i32) {
    let log = || manager().log_tail();
    wait_status(api, name, log, "every Package done", |h| {
        let generation = h.metadata.generation.unwrap_or_default();
        h.status.as_ref().is_some_and(|s| {
            s.observed_generation == generation
                && s.counts.total_packages == total
                && s.counts.updated_packages == total
                && s.counts.available_packages == total
                && s.counts.progressed_packages == total
                && s.counts.in_flight_packages == 0
                && s.counts.failed_packages == 0
        })
    })
    .await;
    let owned =
        kube::api::ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}"));
    let packages = Api::<Package>::all(client.clone())
        .list(&owned)
        .await
        .unwrap();
    let not_done: Vec<_> = packages
        .items
        .iter()
        .filter(|p| !is_done(p))
        .map(|p| p.metadata.namespace.clone())
        .collect();
    assert!(
        not_done.is_empty(),
        "counted done but not done: {not_done:?}"
    );
}

async fn set_release(api: &Api<HostedClusterPackage>, name: &str, spec: &Value) {
    let patch = json!({"spec": {"template": {"spec": spec}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// One HostedClusterPackage over a fleet, and the image whose releases it rolls out.
struct Rollout {
    api: Api<HostedClusterPackage>,
    client: Client,
    name: String,
    group_of: BTreeMap<String, usize>,
    image: String,
}

/// Breaks `release` on the first early cluster, rolls it out, and checks that the rollout halts in the
/// early group with the failing Package named and `why` it fails; returns its namespace.
async fn broken_release_stays_in_its_group(
    rollout: &Rollout,
    simulator: &WorkloadSimulator,
    release: &str,
    why: &str,
) -> String {
    let Rollout {
        api,
        client,
        name,
        group_of,
        image,
    } = rollout;
    let name = name.as_str();
    let log = || manager().log_tail();
    let victim = group_of
        .iter()
        .find(|(_, g)| **g == 0)
        .map(|(ns, _)| ns.clone())
        .unwrap();
    simulator.break_release(&victim, release);
    let spec = release_spec(image, release);
    let observer = RolloutObserver::start(client, name, &spec, group_of.clone()).await;
    set_release(api, name, &spec).await;
    // The rest of the early group completes within the budget; the failing Package holds its slot.
    let h = wait_status(api, name, log, "halted on the failing Package", |h| {
        let generation = h.metadata.generation.unwrap_or_default();
        h.status.as_ref().is_some_and(|s| {
            let early = s.partitions.iter().find(|p| p.name == "early");
            s.observed_generation == generation
                && s.counts.failed_packages == 1
                && early.is_some_and(|p| {
                    p.counts.updated_packages == 3 && p.counts.progressed_packages == 2
                })
        }) && condition(h, "Progressing")
            .is_some_and(|c| c.message.contains(&victim) && c.message.contains(why))
    })
    .await;
    let progressing = condition(&h, "Progressing").unwrap();
    assert!(
        progressing.message.contains(&format!(
            "Rollout halted in group early: 1 failing: {victim}: Latest Revision is Unavailable"
        )) && progressing.message.contains(why),
        "{}",
        progressing.message
    );
    let status = h.status.clone().unwrap();
    let early = status
        .partitions
        .iter()
        .find(|p| p.name == "early")
        .unwrap();
    assert_eq!(
        (
            early.counts.failed_packages,
            early.counts.in_flight_packages
        ),
        (1, 0)
    );
    // The failing cluster's Package does not claim availability: its previous revision handed the
    // object over and vouches for it no more.
    let failing = Api::<Package>::namespaced(client.clone(), &victim)
        .get(name)
        .await
        .unwrap();
    let available = failing
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == "Available")
        .unwrap();
    assert_eq!(available.status, "False", "{available:?}");
    assert_eq!(available.observed_generation, failing.metadata.generation);

    // An Event on the HostedClusterPackage names the Package and why.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    wait_until("a PackageFailed Event", TIMEOUT, || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some("PackageFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref().is_some_and(|n| {
                        n.contains(&format!("Package {victim}/{name} (group early) fails"))
                            && n.contains(why)
                    })
            })
            .map(|_| ())
            .ok_or_else(|| {
                let seen: Vec<_> = list
                    .items
                    .iter()
                    .map(|e| {
                        (
                            e.regarding.as_ref().and_then(|r| r.name.clone()),
                            &e.reason,
                            &e.note,
                        )
                    })
                    .collect();
                format!("none for {victim} among {seen:?}")
            })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nmanager log:\n{}", manager().log_tail()));
    // And so does the rollout event stream.
    let generation = h.metadata.generation.unwrap();
    let told = rollout_events(name).await.into_iter().any(|e| {
        e["generation"] == generation
            && e["kind"] == "packageFailed"
            && e["namespace"] == victim.as_str()
            && e["message"].as_str().is_some_and(|m| m.contains(why))
    });
    assert!(told, "no packageFailed event for {victim}");

    // Nothing outside the early group ever got the broken release.
    let o = observer.observed.lock().unwrap();
    let outside: Vec<&String> = o
        .update_order
        .iter()
        .filter(|ns| group_of[*ns] != 0)
        .collect();
    assert!(outside.is_empty(), "{outside:?} got the broken release");
    assert!(
        o.barrier_violations.is_empty(),
        "{:?}",
        o.barrier_violations
    );
    o.assert_within_budget(MAX_UNAVAILABLE);
    victim
}

/// A healthy release rolls out under the observer; returns how long it took.
async fn healthy_release(rollout: &Rollout, release: &str) -> std::time::Duration {
    let Rollout {
        api,
        client,
        name,
        group_of,
        image,
    } = rollout;
    let spec = &release_spec(image, release);
    let observer = RolloutObserver::start(client, name, spec, group_of.clone()).await;
    let started = Instant::now();
    set_release(api, name, spec).await;
    wait_all_done(api, client, name, group_of.len() as i32).await;
    let took = started.elapsed();
    observer.finish(MAX_UNAVAILABLE);
    took
}

/// The shared environment without kube-controller-manager (its deployment controller would overwrite
/// the Deployment status the simulator writes), the Widget kind, and the manager; then a fleet of
/// [`RISKS`] with a HostedClusterPackage that has rolled `example`'s release v1 out to it, with
/// `simulate` standing in for the workload's controller.
async fn start_rollout(
    prefix: &str,
    example: &str,
    simulate: fn(&Client, BTreeSet<String>) -> WorkloadSimulator,
) -> (Rollout, WorkloadSimulator) {
    shared_with(EnvConfig {
        controller_manager: false,
        ..EnvConfig::default()
    })
    .unwrap();
    let client = env().management().client().await.unwrap();
    // Installed before the shared manager starts, whichever test starts it.
    install_widget_crd(&client, WIDGET_GROUP).await;
    manager();
    let (fleet_ns, clusters) = fleet(prefix, &RISKS).await;
    let simulator = simulate(
        &client,
        clusters.iter().map(|c| c.hcp_namespace.clone()).collect(),
    );
    let image = build_and_push(example, &format!("{prefix}:1"));
    let name = format!("{fleet_ns}-rollout");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let mut h = hcpkg(
        &name,
        &fleet_ns,
        &image,
        json!({"rollingUpgrade": {"maxUnavailable": MAX_UNAVAILABLE}}),
        Some(risk_partition()),
    );
    h.spec.template.spec = serde_json::from_value(release_spec(&image, "v1")).unwrap();
    api.create(&PostParams::default(), &h).await.unwrap();
    wait_all_done(&api, &client, &name, RISKS.len() as i32).await;
    let rollout = Rollout {
        api,
        client,
        name,
        group_of: group_of(&clusters, &RISKS),
        image,
    };
    (rollout, simulator)
}

#[tokio::test]
async fn releases_gate_on_live_revisions_of_a_custom_resource() {
    let (rollout, simulator) = start_rollout("hcpkg-widget", "fleet-widget", widgets).await;

    // (a) A healthy release: budget and barrier hold under the strict definition, and each wave waits
    // for its workloads to get ready.
    let took = healthy_release(&rollout, "v2").await;
    let floor = READINESS_LAG * waves(&rollout.group_of);
    assert!(took >= floor, "rolled out in {took:?}, less than {floor:?}");

    // (b) A release broken on one early cluster stays in the early group; the next one completes.
    let why = "condition \"Available\" is \"False\"";
    broken_release_stays_in_its_group(&rollout, &simulator, "v3", why).await;
    healthy_release(&rollout, "v4").await;
}

#[tokio::test]
async fn releases_gate_on_live_revisions_of_a_deployment() {
    let (rollout, simulator) = start_rollout("hcpkg-deploy", "fleet-deployment", deployments).await;

    // (c) The new Pod of one early cluster never gets ready: its Deployment keeps the old Pod and
    // reports 1 of 2 replicas updated, which the probe names; nothing leaves the early group.
    let why = "\".status.updatedReplicas\" == \".status.replicas\": 1 != 2";
    broken_release_stays_in_its_group(&rollout, &simulator, "v2", why).await;
    healthy_release(&rollout, "v3").await;
}
