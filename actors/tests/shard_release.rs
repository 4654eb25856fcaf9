//! Letting an object go to another replica, against a real apiserver: a watch feed of this crate over
//! ConfigMaps, whose actors hold their work open until the test lets it end (as an ObjectSetPhase's actor
//! waits for a connector that does not answer).
//!
//! The chaos run (CI, seed 839) found two ways a drained object's labels went while its actor still
//! worked: a re-list of the drained object released it at once, and an actor started for the object while
//! the former one stopped had its release land after the coordinator labelled the object for the new
//! owner, stripping that label. Each test here failed before the feed kept one stop per object.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use pko_actors::engine::sharding::shard_assignment::{owner, ShardKey, ShardView};
use pko_actors::runtime::kind_feed::shard_release::{remove_shard_labels, ReleaseOutcome};
use pko_actors::runtime::kind_feed::{FeedTarget, Gone, KindFeed, Observed, Release};
use pko_actors::runtime::registry::{ObjectRef, Registry};
use pko_actors::runtime::runtime_context::{RuntimeContext, ShardContext, SharedContext};
use pko_actors::runtime::takeover_lists::TakeoverLists;
use pko_proto::well_known::{SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};
use pko_testenv::wait_until;
use tokio::sync::{mpsc, oneshot, watch};

const TIMEOUT: Duration = Duration::from_secs(30);

/// An actor started its work on an object; the work runs until `finish` is sent (or dropped).
struct Started {
    name: String,
    finish: oneshot::Sender<()>,
}

/// What the test hears of the actors, shared by all of them.
#[derive(Clone)]
struct Heard {
    runtime: RuntimeContext,
    started: mpsc::UnboundedSender<Started>,
    /// Every state an actor was handed: name and resourceVersion.
    observed: mpsc::UnboundedSender<(String, String)>,
    /// An actor was asked to let go.
    releasing: mpsc::UnboundedSender<String>,
    /// Actors working on each object now.
    working: Arc<Mutex<HashMap<String, usize>>>,
    /// Two actors of this replica worked on one object at once.
    overlapped: Arc<AtomicBool>,
    /// An actor was handed an object with its field records (`managedFields`).
    field_records: Arc<AtomicBool>,
}

impl SharedContext for Heard {
    fn runtime(&self) -> &RuntimeContext {
        &self.runtime
    }
}

/// Works on one ConfigMap: from its first state until the test ends the work; a release is answered
/// only after that, as the reconcile shell answers one only after its running work.
struct Holding {
    heard: Heard,
    name: Option<String>,
    work: Option<oneshot::Receiver<()>>,
}

impl Holding {
    fn stop_working(&mut self) {
        if let Some(name) = &self.name {
            if let Some(count) = self.heard.working.lock().unwrap().get_mut(name) {
                *count -= 1;
            }
        }
    }
}

impl Actor for Holding {
    type Context = Context<Self>;
}

impl Handler<Observed<ConfigMap>> for Holding {
    type Result = ();

    fn handle(&mut self, Observed(map): Observed<ConfigMap>, _: &mut Context<Self>) {
        let name = map.metadata.name.clone().unwrap_or_default();
        let version = map.metadata.resource_version.clone().unwrap_or_default();
        if map.metadata.managed_fields.is_some() {
            self.heard.field_records.store(true, Ordering::SeqCst);
        }
        self.heard.observed.send((name.clone(), version)).unwrap();
        if self.name.is_some() {
            return;
        }
        let mut working = self.heard.working.lock().unwrap();
        let count = working.entry(name.clone()).or_default();
        *count += 1;
        if *count > 1 {
            self.heard.overlapped.store(true, Ordering::SeqCst);
        }
        let (finish, work) = oneshot::channel();
        self.work = Some(work);
        self.name = Some(name.clone());
        self.heard.started.send(Started { name, finish }).unwrap();
    }
}

impl Handler<Release> for Holding {
    type Result = ();

    fn handle(&mut self, Release(done): Release, ctx: &mut Context<Self>) {
        let name = self.name.clone().unwrap_or_default();
        self.heard.releasing.send(name).unwrap();
        let work = self.work.take();
        let ended = async move {
            if let Some(work) = work {
                let _ = work.await;
            }
        };
        ctx.wait(ended.into_actor(self).map(move |(), actor, ctx| {
            actor.stop_working();
            let _ = done.send(());
            ctx.stop();
        }));
    }
}

impl Handler<Gone> for Holding {
    type Result = ();

    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        self.stop_working();
        ctx.stop();
    }
}

impl FeedTarget for Holding {
    type Object = ConfigMap;
    type Shared = Heard;

    fn start_for(heard: &Heard) -> Addr<Self> {
        Holding {
            heard: heard.clone(),
            name: None,
            work: None,
        }
        .start()
    }

    fn key(map: &ConfigMap) -> ObjectRef {
        ObjectRef {
            kind: "ConfigMap",
            namespace: map.metadata.namespace.clone().unwrap_or_default(),
            name: map.metadata.name.clone().unwrap_or_default(),
        }
    }

    fn tombstone(map: &ConfigMap) -> ConfigMap {
        ConfigMap {
            metadata: map.metadata.clone(),
            ..ConfigMap::default()
        }
    }
}

/// A replica's ConfigMap feed and what the test hears of it.
struct Replica {
    member: String,
    view: watch::Sender<ShardView>,
    lists: TakeoverLists,
    overlapped: Arc<AtomicBool>,
    field_records: Arc<AtomicBool>,
    started: mpsc::UnboundedReceiver<Started>,
    observed: mpsc::UnboundedReceiver<(String, String)>,
    releasing: mpsc::UnboundedReceiver<String>,
}

fn view(live: &[&str], takeovers: &[(&str, &str)]) -> ShardView {
    ShardView {
        live: live.iter().map(|m| (*m).to_owned()).collect(),
        departed: takeovers.iter().map(|(d, _)| (*d).to_owned()).collect(),
        takeovers: takeovers
            .iter()
            .map(|(d, s)| ((*d).to_owned(), BTreeSet::from([(*s).to_owned()])))
            .collect(),
        ..ShardView::default()
    }
}

impl Replica {
    async fn start(member: &str) -> Self {
        Self::start_feed(member, false).await
    }

    /// Sharded replicas watch HostedClusters with a gated feed: every object, actors only for theirs.
    async fn start_gated(member: &str) -> Self {
        Self::start_feed(member, true).await
    }

    async fn start_feed(member: &str, gated: bool) -> Self {
        let env = pko_testenv::shared().unwrap();
        let client = env.management().client().await.unwrap();
        let (view_tx, view_rx) = watch::channel(view(&[member, "other-replica"], &[]));
        let lists = TakeoverLists::new(Default::default());
        let (started_tx, started) = mpsc::unbounded_channel();
        let (observed_tx, observed) = mpsc::unbounded_channel();
        let (releasing_tx, releasing) = mpsc::unbounded_channel();
        let overlapped = Arc::new(AtomicBool::new(false));
        let field_records = Arc::new(AtomicBool::new(false));
        let heard = Heard {
            runtime: RuntimeContext {
                client: client.clone(),
                watch_client: client.clone(),
                initial_lists: Default::default(),
                feeds: Default::default(),
                events: pko_actors::runtime::event_sink::EventSink::start(client),
                shard: Some(ShardContext {
                    member: member.into(),
                    view: view_rx,
                    lists: lists.clone(),
                }),
                metrics: Default::default(),
            },
            started: started_tx,
            observed: observed_tx,
            releasing: releasing_tx,
            working: Arc::default(),
            overlapped: overlapped.clone(),
            field_records: field_records.clone(),
        };
        let feed = KindFeed::<ConfigMap, Holding>::new(heard, Arc::new(Registry::default()), None);
        if gated {
            feed.gated().start();
        } else {
            feed.start();
        }
        Self {
            member: member.to_owned(),
            view: view_tx,
            lists,
            overlapped,
            field_records,
            started,
            observed,
            releasing,
        }
    }

    async fn started(&mut self, name: &str) -> oneshot::Sender<()> {
        let started = tokio::time::timeout(TIMEOUT, self.started.recv())
            .await
            .unwrap_or_else(|_| panic!("no actor started for {name}"))
            .unwrap();
        assert_eq!(started.name, name, "an actor started for another object");
        started.finish
    }

    async fn releasing(&mut self, name: &str) {
        let releasing = tokio::time::timeout(TIMEOUT, self.releasing.recv())
            .await
            .unwrap_or_else(|_| panic!("{name} was not let go"))
            .unwrap();
        assert_eq!(releasing, name);
    }

    /// Waits until an actor is handed `name` at `version`: every event the feed routed before it was
    /// routed by then (one watch delivers in the order etcd stored them).
    async fn observed(&mut self, name: &str, version: &str) {
        let seen = tokio::time::timeout(TIMEOUT, async {
            while let Some((seen, at)) = self.observed.recv().await {
                if seen == name && at == version {
                    return;
                }
            }
        })
        .await;
        assert!(seen.is_ok(), "{name} at {version} never reached its actor");
    }

    /// The feed lists its own label once more: a take-over starts and ends (every object relabelled).
    async fn relist(&mut self, marker: &Api<ConfigMap>) {
        let departed = format!("{}-departed", self.member);
        self.view
            .send(view(
                &[&self.member, "other-replica"],
                &[(&departed, &self.member)],
            ))
            .unwrap();
        let lists = self.lists.clone();
        wait_until("the take-over listed", TIMEOUT, || async {
            lists
                .complete(&departed)
                .then_some(())
                .ok_or("not yet".to_owned())
        })
        .await
        .unwrap();
        let version = marker
            .get("zz-marker")
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        // Drain what the marker's actor was handed so far: the re-list hands it this version again.
        while self.observed.try_recv().is_ok() {}
        self.view
            .send(view(&[&self.member, "other-replica"], &[]))
            .unwrap();
        self.observed("zz-marker", &version).await;
    }
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

async fn merge(api: &Api<ConfigMap>, name: &str, patch: serde_json::Value) -> String {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

fn shard_labels(map: &ConfigMap) -> BTreeMap<String, String> {
    map.metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("shard.package-operator.run/"))
        .collect()
}

async fn namespace_api(prefix: &str) -> Api<ConfigMap> {
    dynamic_and_typed(prefix).await.1
}

async fn dynamic_and_typed(prefix: &str) -> (Api<DynamicObject>, Api<ConfigMap>) {
    let env = pko_testenv::shared().unwrap();
    let namespace = env.management().create_namespace(prefix).await.unwrap();
    let client = env.management().client().await.unwrap();
    let resource = ApiResource::erase::<ConfigMap>(&());
    (
        Api::namespaced_with(client.clone(), &namespace, &resource),
        Api::namespaced(client, &namespace),
    )
}

/// A drained object listed again while its actor still works is not released then: its labels go only
/// after the work ended (CI seed 839: the re-list after a take-over released an ObjectSetPhase whose
/// actor still waited for its connector).
#[actix::test]
async fn a_relist_while_the_actor_stops_does_not_release_the_object() {
    let api = namespace_api("release-relist").await;
    let mut replica = Replica::start("release-relist-a").await;
    let owner = [(SHARD_OWNER_LABEL, replica.member.as_str())];
    for name in ["object", "quick", "zz-marker"] {
        api.create(&PostParams::default(), &labelled(name, &owner))
            .await
            .unwrap();
    }
    let finish = replica.started("object").await;
    replica.started("quick").await.send(()).unwrap();
    let _marker = replica.started("zz-marker").await;
    let drain = serde_json::json!({"metadata": {"labels": {SHARD_DRAIN_LABEL: "true"}}});
    merge(&api, "object", drain.clone()).await;
    replica.releasing("object").await;

    replica.relist(&api).await;
    // A release the re-list sent went out before this one, whose actor has no work left: once this one
    // landed, so had that.
    merge(&api, "quick", drain).await;
    replica.releasing("quick").await;
    wait_released(&api, "quick").await;
    assert_eq!(
        shard_labels(&api.get("object").await.unwrap()).len(),
        2,
        "released while its actor still worked"
    );
    finish.send(()).unwrap();
    wait_released(&api, "object").await;
    assert!(!replica.overlapped.load(Ordering::SeqCst));
    // The apiserver keeps field records of the writes (here of the marker's labels); the feed drops
    // them before any actor keeps a copy (issue 42: they were an eighth of the manager's heap).
    let marker = api.get("zz-marker").await.unwrap();
    assert!(marker.metadata.managed_fields.is_some());
    assert!(!replica.field_records.load(Ordering::SeqCst));
}

async fn wait_released(api: &Api<ConfigMap>, name: &str) {
    wait_until(&format!("{name} released"), TIMEOUT, || async {
        let map = api.get(name).await.map_err(|e| e.to_string())?;
        shard_labels(&map)
            .is_empty()
            .then_some(())
            .ok_or(format!("labels {:?}", shard_labels(&map)))
    })
    .await
    .unwrap();
}

/// An object labelled for this replica again while its actor stops (the coordinator gave the key back,
/// or a parent's apply wrote this replica's label) gets its next actor only after the former one
/// stopped, and keeps its labels.
#[actix::test]
async fn an_object_ours_again_while_its_actor_stops_gets_no_second_actor_beside_it() {
    let api = namespace_api("release-back").await;
    let mut replica = Replica::start("release-back-a").await;
    let owner = [(SHARD_OWNER_LABEL, replica.member.as_str())];
    for name in ["object", "zz-marker"] {
        api.create(&PostParams::default(), &labelled(name, &owner))
            .await
            .unwrap();
    }
    let finish = replica.started("object").await;
    let _marker = replica.started("zz-marker").await;
    merge(
        &api,
        "object",
        serde_json::json!({"metadata": {"labels": {SHARD_DRAIN_LABEL: "true"}}}),
    )
    .await;
    replica.releasing("object").await;

    merge(
        &api,
        "object",
        serde_json::json!({"metadata": {"labels": {SHARD_DRAIN_LABEL: null}}}),
    )
    .await;
    let marked = merge(
        &api,
        "zz-marker",
        serde_json::json!({"metadata": {"annotations": {"test/after": "undrained"}}}),
    )
    .await;
    replica.observed("zz-marker", &marked).await;
    assert!(
        !replica.overlapped.load(Ordering::SeqCst),
        "a second actor started while the first still worked"
    );
    finish.send(()).unwrap();
    let _next = replica.started("object").await;
    assert!(!replica.overlapped.load(Ordering::SeqCst));
    let map = api.get("object").await.unwrap();
    assert_eq!(
        shard_labels(&map),
        BTreeMap::from([(SHARD_OWNER_LABEL.to_owned(), replica.member.clone())]),
        "an object that is ours again keeps its label"
    );
}

/// An object's name and labels, the holder a release names, and what it does.
type ReleaseCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
    ReleaseOutcome,
);

/// A take-over that finds the departed member's object drained already (a member joined between the
/// departure and the take-over record) lets it go although it never worked on it. The gated feed
/// routed only what moved between "ours" and "not ours", so the drained HostedCluster stayed labelled
/// for the departed member, and the coordinator never gave its HCP namespace to the newcomer (seed 3,
/// 20 minutes: the canary's last release never rolled out).
#[actix::test]
async fn a_take_over_releases_what_it_finds_drained() {
    let api = namespace_api("release-gated").await;
    let mut replica = Replica::start_gated("release-gated-a").await;
    let departed = format!("{}-departed", replica.member);
    let drained = [
        (SHARD_OWNER_LABEL, departed.as_str()),
        (SHARD_DRAIN_LABEL, "true"),
    ];
    api.create(&PostParams::default(), &labelled("object", &drained))
        .await
        .unwrap();
    let marker = api
        .create(
            &PostParams::default(),
            &labelled("zz-marker", &[(SHARD_OWNER_LABEL, replica.member.as_str())]),
        )
        .await
        .unwrap();
    replica
        .observed("zz-marker", &marker.metadata.resource_version.unwrap())
        .await;

    replica
        .view
        .send(view(
            &[&replica.member, "other-replica"],
            &[(&departed, &replica.member)],
        ))
        .unwrap();
    wait_released(&api, "object").await;
    assert!(
        replica
            .started
            .try_recv()
            .is_ok_and(|s| s.name == "zz-marker"),
        "only the marker's actor started"
    );
}

/// The release removes the shard labels only while they say what it was decided on, in the same write:
/// drained, held by the replica it names.
#[tokio::test]
async fn a_release_changes_nothing_once_the_labels_moved_on() {
    let (dynamic, api) = dynamic_and_typed("release-patch").await;
    let cases: [ReleaseCase; 5] = [
        (
            "drained",
            &[(SHARD_OWNER_LABEL, "a"), (SHARD_DRAIN_LABEL, "true")],
            Some("a"),
            ReleaseOutcome::Released,
        ),
        (
            "labelled-for-another",
            &[(SHARD_OWNER_LABEL, "b")],
            Some("a"),
            ReleaseOutcome::LabelsChanged,
        ),
        (
            "drained-from-another",
            &[(SHARD_OWNER_LABEL, "b"), (SHARD_DRAIN_LABEL, "true")],
            Some("a"),
            ReleaseOutcome::LabelsChanged,
        ),
        (
            "given-back",
            &[(SHARD_OWNER_LABEL, "a")],
            Some("a"),
            ReleaseOutcome::LabelsChanged,
        ),
        (
            "drained-unheld",
            &[(SHARD_DRAIN_LABEL, "true")],
            None,
            ReleaseOutcome::Released,
        ),
    ];
    for (name, labels, holder, outcome) in cases {
        let created = api
            .create(&PostParams::default(), &labelled(name, labels))
            .await
            .unwrap();
        assert_eq!(
            remove_shard_labels(&dynamic, name, holder).await.unwrap(),
            outcome,
            "{name}"
        );
        let now = api.get(name).await.unwrap();
        let expected = if outcome == ReleaseOutcome::Released {
            BTreeMap::new()
        } else {
            shard_labels(&created)
        };
        assert_eq!(shard_labels(&now), expected, "{name}");
    }
    assert_eq!(
        remove_shard_labels(&dynamic, "missing", Some("a"))
            .await
            .unwrap(),
        ReleaseOutcome::Gone
    );
}

/// A ConfigMap API in a new namespace, and the namespace's shard key.
async fn keyed_namespace(prefix: &str) -> (Api<ConfigMap>, ShardKey) {
    let env = pko_testenv::shared().unwrap();
    let namespace = env.management().create_namespace(prefix).await.unwrap();
    let client = env.management().client().await.unwrap();
    (
        Api::namespaced(client, &namespace),
        ShardKey::Namespace(namespace),
    )
}

/// A departed member's successor departs in turn and its record hands a key on to this replica. No
/// event about the key's objects comes: the watch on the first departed member's label showed them
/// while the successor was their worker. They are routed again under the new view: the one drained
/// meanwhile is let go, the other is worked on. (CI, the sharding test: a Package drained while a
/// killed successor was its worker stayed labelled for the first departed member, and no replica
/// reconciled it again.)
#[actix::test]
async fn a_take_over_handed_on_to_this_replica_routes_what_it_showed_before() {
    let mut replica = Replica::start("release-chain-a").await;
    let me = replica.member.clone();
    let first = format!("{me}-first");
    let successor = format!("{me}-successor");
    let successors: BTreeSet<String> = [me.clone(), successor.clone()].into();
    // A namespace the first record gives to the successor, and one it gives to this replica.
    let (mut theirs, mut ours) = (None, None);
    while theirs.is_none() || ours.is_none() {
        let (api, key) = keyed_namespace("release-chain").await;
        let slot = if owner(&key, &successors) == Some(&me) {
            &mut ours
        } else {
            &mut theirs
        };
        slot.get_or_insert(api);
    }
    let (theirs, ours) = (theirs.unwrap(), ours.unwrap());
    let drained = [
        (SHARD_OWNER_LABEL, first.as_str()),
        (SHARD_DRAIN_LABEL, "true"),
    ];
    for (api, name, labels) in [
        (&theirs, "drained", &drained[..]),
        (&theirs, "adopted", &drained[..1]),
        (&ours, "witness", &drained[..]),
    ] {
        api.create(&PostParams::default(), &labelled(name, labels))
            .await
            .unwrap();
    }
    let mut taken_over = ShardView {
        live: successors.clone(),
        departed: [first.clone()].into(),
        takeovers: [(first.clone(), successors)].into(),
        ..ShardView::default()
    };
    replica.view.send(taken_over.clone()).unwrap();
    // The take-over's list is routed in one go once listed: the witness let go means the successor's
    // objects were routed too, while it was their worker.
    wait_released(&ours, "witness").await;
    assert_eq!(shard_labels(&theirs.get("drained").await.unwrap()).len(), 2);
    assert!(replica.started.try_recv().is_err(), "an actor started");

    taken_over.live.remove(&successor);
    taken_over.departed.insert(successor.clone());
    taken_over.takeovers.insert(successor, [me.clone()].into());
    replica.view.send(taken_over).unwrap();
    wait_released(&theirs, "drained").await;
    let _adopted = replica.started("adopted").await;
    assert!(!replica.overlapped.load(Ordering::SeqCst));
}
