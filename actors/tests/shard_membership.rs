//! Shard membership against a real apiserver (issue 20): replicas joining appear in every member's view,
//! one leaving disappears at once, and a member Lease that is no longer renewed drops out when it runs out;
//! a take-over record on a departed member's Lease shows in every view.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Api;
use pko_actors::engine::sharding::shard_assignment::ShardView;
use pko_actors::runtime::shard_coordinator::take_over_record;
use pko_actors::runtime::shard_membership::{MemberIdentity, ShardMembership};
use pko_actors::runtime::write_fence::WriteFence;
use pko_proto::well_known::{
    SHARD_MEMBER_LABEL, SHARD_RESTARTING_ANNOTATION, SHARD_SUCCESSORS_ANNOTATION,
};
use pko_testenv::wait_until;
use tokio::sync::watch;

const TIMEOUT: Duration = Duration::from_secs(30);

async fn kube_config() -> kube::Config {
    let env = pko_testenv::shared().unwrap();
    let file = Kubeconfig::read_from(env.management().kubeconfig_path()).unwrap();
    kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap()
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

async fn wait_view(
    view: &watch::Receiver<ShardView>,
    what: &str,
    holds: impl Fn(&ShardView) -> bool,
) {
    wait_until(what, TIMEOUT, || async {
        let now = view.borrow().clone();
        if holds(&now) {
            Ok(())
        } else {
            Err(format!("view {now:?}"))
        }
    })
    .await
    .unwrap();
}

async fn wait_members(view: &watch::Receiver<ShardView>, want: &[&str]) {
    let want = names(want);
    wait_view(view, &format!("members {want:?}"), |v| v.live == want).await;
}

/// Joins the members in `namespace` as `identity`, with 3 s Leases.
async fn join(client: &kube::Client, namespace: &str, identity: MemberIdentity) -> ShardMembership {
    ShardMembership::join(
        kube_config().await,
        client.clone(),
        namespace,
        &identity,
        Duration::from_secs(3),
        WriteFence::open(),
        Default::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn members_join_leave_and_run_out() {
    let env = pko_testenv::shared().unwrap();
    let namespace = env.management().create_namespace("shards").await.unwrap();
    let client = env.management().client().await.unwrap();
    let join = |identity: &'static str| {
        join(
            &client,
            &namespace,
            MemberIdentity {
                member: identity.to_owned(),
                holder: identity.to_owned(),
            },
        )
    };
    let a = join("replica-a").await;
    let b = join("replica-b").await;
    wait_members(&a.view(), &["replica-a", "replica-b"]).await;
    wait_members(&b.view(), &["replica-a", "replica-b"]).await;

    // Leaving releases the Lease: the others see it at once, not after it runs out, as departed.
    let view = b.view();
    a.leave().await;
    wait_members(&view, &["replica-b"]).await;
    assert!(view.borrow().departed.contains("replica-a"));
    // The coordinator's take-over record shows in the view.
    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    leases
        .patch(
            "pko-shard-replica-a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                SHARD_SUCCESSORS_ANNOTATION: "replica-b",
            }}})),
        )
        .await
        .unwrap();
    wait_view(&view, "replica-a taken over by replica-b", |v| {
        v.takeovers.get("replica-a") == Some(&names(&["replica-b"]))
    })
    .await;

    // A member that stopped renewing (a crashed replica) drops out when its Lease runs out, timed from
    // when the Lease was seen, whatever its renewTime says: one written by a clock a minute behind is
    // live at first, one written by a clock ten minutes ahead runs out all the same.
    let crashed = |member: &str, renewed: Timestamp| Lease {
        metadata: ObjectMeta {
            name: Some(format!("pko-shard-{member}")),
            labels: Some([(SHARD_MEMBER_LABEL.to_owned(), member.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(member.into()),
            lease_duration_seconds: Some(2),
            renew_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }),
    };
    let minute = k8s_openapi::jiff::SignedDuration::from_secs(60);
    for (member, renewed) in [
        ("behind", Timestamp::now() - minute),
        ("ahead", Timestamp::now() + minute * 10),
    ] {
        Api::<Lease>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &crashed(member, renewed))
            .await
            .unwrap();
        wait_members(&view, &[member, "replica-b"]).await;
        wait_members(&view, &["replica-b"]).await;
    }
    b.leave().await;
}

/// A member whose name outlives its process (a StatefulSet's pod) keeps its Lease when it stops: the
/// others count it a member while the Lease lasts, and the next process under the name takes it back. A
/// take-over decided from the Lease as it was before that is refused by the apiserver, so the successors
/// never work beside the restarted process.
#[tokio::test]
async fn a_member_name_that_outlives_the_process_keeps_the_share_across_a_restart() {
    let env = pko_testenv::shared().unwrap();
    let namespace = env.management().create_namespace("restarts").await.unwrap();
    let client = env.management().client().await.unwrap();
    let join = |identity| join(&client, &namespace, identity);
    let observer = join(MemberIdentity::named("observer", 1).unwrap()).await;
    let first = join(MemberIdentity::named("stable", 2).unwrap()).await;
    let view = observer.view();
    wait_members(&view, &["observer", "stable"]).await;

    // Stopped: still a member while the Lease lasts, then departed, at the version that showed it.
    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    first.leave().await;
    let released = leases.get("pko-shard-stable").await.unwrap();
    let annotations = released.metadata.annotations.clone().unwrap_or_default();
    assert!(annotations[SHARD_RESTARTING_ANNOTATION].starts_with("stable/"));
    assert!(view.borrow().live.contains("stable"), "{:?}", view.borrow());
    wait_members(&view, &["observer"]).await;
    let departed_at = view.borrow().departed_versions["stable"].clone();
    assert_eq!(
        Some(&departed_at),
        released.metadata.resource_version.as_ref()
    );

    // The next process under the name takes the Lease back: a member again, the mark gone.
    let second = join(MemberIdentity::named("stable", 3).unwrap()).await;
    wait_members(&view, &["observer", "stable"]).await;
    let taken = leases.get("pko-shard-stable").await.unwrap();
    assert!(!taken
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key(SHARD_RESTARTING_ANNOTATION));
    assert!(taken.spec.unwrap().holder_identity.unwrap().ends_with("-3"));
    // A coordinator that decided the take-over from the departed Lease writes over that version only.
    let stale = leases
        .patch(
            "pko-shard-stable",
            &PatchParams::default(),
            &Patch::Merge(take_over_record("observer", Some(&departed_at))),
        )
        .await;
    assert!(
        matches!(&stale, Err(kube::Error::Api(e)) if e.code == 409),
        "{stale:?}"
    );
    assert!(view.borrow().takeovers.is_empty());
    second.leave().await;
    observer.leave().await;
}
