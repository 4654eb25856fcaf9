//! The sharded part of a watch feed: which objects this replica works on under the current view, the
//! watches on departed members' labels it takes over from (their events held until every feed listed
//! them) and the read that tells an object relabelled from one deleted. Letting an object go is
//! `shard_release.rs`; the feed's routing itself is `kind_feed.rs`.

use actix::dev::ToEnvelope;
use actix::prelude::*;
use kube::runtime::watcher;
use pko_proto::well_known::SHARD_OWNER_LABEL;
use tracing::{info, warn};

use super::{
    FeedTarget, Gone, KindFeed, LabelledAs, Observed, ShardSignal, ShardState, WatchedKind,
};
use crate::engine::sharding::shard_assignment::{drained, works_on, Member, Placement, ShardKey};
use crate::runtime::known_objects::WatchSource;
use crate::runtime::registry::ObjectRef;
use crate::runtime::takeover_lists::HOLD_LIMIT;

/// How long a feed waits before reading again an object whose read failed.
pub(super) const LOST_READ_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The watch on a departed member's label. Its list is served from the apiserver's watch cache (whatever
/// a stale list misses arrives as an event): a consistent list of a label selection reads every object of
/// the kind from etcd and filters after, seconds for thousands of ObjectSets with every successor listing
/// at once. The client sends `resourceVersion=0` only on an unpaged list, hence no page size.
pub(super) fn departed_watch_config(departed: &str) -> watcher::Config {
    let mut config = watcher::Config::default()
        .labels(&format!("{SHARD_OWNER_LABEL}={departed}"))
        .any_semantic();
    config.page_size = None;
    config
}

impl<K, A> StreamHandler<ShardSignal> for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    fn handle(&mut self, signal: ShardSignal, ctx: &mut Context<Self>) {
        match signal {
            ShardSignal::ViewChanged(view) => {
                let changed = !self.view.takeovers.keys().eq(view.takeovers.keys());
                self.view = view;
                if changed {
                    self.takeovers_changed(ctx);
                }
            }
            ShardSignal::TakeoverListed => self.takeovers_listed_by_all(ctx),
        }
    }

    /// The view ends only when the process does; the feed keeps its last view until then.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl<K, A> KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    /// Whether the object under `key` was last seen by `source`'s watch as `uid` (not seen since by
    /// another watch of this feed, and followed here at all).
    pub(super) fn last_seen_by(&self, key: &ObjectRef, source: &WatchSource, uid: &str) -> bool {
        self.known
            .sighting(key)
            .is_some_and(|sighting| sighting.source == *source && sighting.uid == uid)
    }

    /// Reads an object a departed member's watch lost (`last`: its last state, if the feed has it), to
    /// tell a relabelling from a deletion.
    pub(super) fn check_lost(
        &self,
        ctx: &mut Context<Self>,
        source: WatchSource,
        key: ObjectRef,
        uid: String,
        last: Option<A::Object>,
    ) {
        let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
        let api = self.dynamic_api(&self.runtime.watch_client, namespace);
        let name = key.name.clone();
        let read = async move { api.get_opt(&name).await };
        // Answered on the feed, in order with its watch events.
        ctx.spawn(read.into_actor(self).map(move |found, feed, ctx| match found {
            Ok(found) => feed.lost_checked(ctx, source, key, uid, last, found),
            Err(error) => {
                // Until a read answers, the object keeps its actor.
                warn!(kind = %K::kind(&()), object = ?key, %error, "reading an object a departed member's watch lost failed; reading again");
                ctx.run_later(LOST_READ_RETRY, move |feed, ctx| {
                    feed.check_lost(ctx, source, key, uid, last)
                });
            }
        }));
    }

    /// What a read after a departed watch's delete found: the object itself (moved: it stays with this
    /// replica if labelled for it, else its actor stops) or nothing of that UID (deleted).
    pub(super) fn lost_checked(
        &mut self,
        ctx: &mut Context<Self>,
        source: WatchSource,
        key: ObjectRef,
        uid: String,
        last: Option<A::Object>,
        found: Option<kube::api::DynamicObject>,
    ) {
        if !self.last_seen_by(&key, &source, &uid) {
            // Another event about it came meanwhile and was routed.
            return;
        }
        match found {
            Some(found) if found.metadata.uid.as_deref() == Some(uid.as_str()) => {
                match self.shard_of(&found.metadata) {
                    ShardState::Ours => {
                        // Labelled for this replica now: its own watch delivers it (or did).
                        self.known.moved(&key, WatchSource::Own);
                    }
                    ShardState::NotOurs { drained } => {
                        self.known.deleted(&key);
                        let labelled = LabelledAs::of(&found.metadata);
                        // The state read now, as this kind (`last` only if it does not parse).
                        let read = serde_json::to_value(found)
                            .and_then(serde_json::from_value::<K>)
                            .map(A::Object::from);
                        match read.ok().or(last) {
                            Some(object) => self.let_go(ctx, &key, &object, labelled, drained),
                            None => self.stop_actor(ctx, &key, super::AfterStop::Nothing),
                        }
                    }
                }
            }
            _ => {
                info!(kind = %K::kind(&()), object = ?key, "deleted while taken over");
                self.known.deleted(&key);
                self.deliver_gone(&key, last.as_ref());
            }
        }
    }

    /// Whether this replica works on an object with these labels (the engine's `works_on`).
    pub(super) fn shard_of(&self, meta: &kube::api::ObjectMeta) -> ShardState {
        let Some(shard) = &self.runtime.shard else {
            return ShardState::Ours;
        };
        let key = ShardKey::of_kind(
            &K::kind(&()),
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        );
        let placement = Placement::from_labels(meta.labels.as_ref());
        if works_on(&shard.member, &key, &placement, &self.view) {
            ShardState::Ours
        } else {
            ShardState::NotOurs {
                drained: drained(&shard.member, &key, &placement, &self.view),
            }
        }
    }

    /// Starts a watch of the objects labelled for `departed`, which this replica takes over from.
    pub(super) fn watch_departed(&mut self, ctx: &mut Context<Self>, departed: &Member) {
        if let Some(shard) = &self.runtime.shard {
            shard.lists.watching(departed);
            if !shard.lists.complete(departed) {
                self.held.insert(departed.clone(), Vec::new());
                let member = departed.clone();
                ctx.run_later(HOLD_LIMIT, move |feed, ctx| feed.replay(ctx, &member));
            }
        }
        let source = WatchSource::Departed(departed.clone());
        let config = departed_watch_config(departed);
        self.listing_since
            .insert(source.clone(), std::time::Instant::now());
        let handle = self.start_watch(ctx, source, config);
        self.departed.insert(departed.clone(), handle);
    }

    /// Restarts the watch on `departed`'s label: its list routes each object it selects again.
    fn relist_departed(&mut self, ctx: &mut Context<Self>, departed: &Member) {
        if let Some(handle) = self.departed.remove(departed) {
            ctx.cancel_future(handle);
        }
        let source = WatchSource::Departed(departed.clone());
        // What a departure event of the old watch would have told is in the new list.
        self.released.retain(|_, s| *s != source);
        self.watch_departed(ctx, departed);
    }

    /// The take-overs changed: a watch for each departed member newly taken over from; for each whose
    /// record went (every object relabelled), its watch stops and the own watch lists again, which
    /// tells what of its objects went elsewhere. A gated feed routes what it holds under the new view.
    pub(super) fn takeovers_changed(&mut self, ctx: &mut Context<Self>) {
        if self.gated {
            self.reroute_pending = true;
            if self.takeovers_listed() {
                self.reroute(ctx);
            } else {
                ctx.run_later(HOLD_LIMIT, |feed, ctx| feed.reroute(ctx));
            }
            return;
        }
        let ended: Vec<Member> = self
            .departed
            .keys()
            .filter(|m| !self.view.takeovers.contains_key(*m))
            .cloned()
            .collect();
        for member in &ended {
            if let Some(handle) = self.departed.remove(member) {
                ctx.cancel_future(handle);
            }
            let source = WatchSource::Departed(member.clone());
            self.known.hand_to_own(&source);
            self.released.retain(|_, s| *s != source);
            self.listing_since.remove(&source);
            // The own watch's list answers for whatever was still held.
            self.held.remove(member);
            self.counted.remove(member);
            if let Some(shard) = &self.runtime.shard {
                shard.lists.ended(member);
            }
        }
        let started: Vec<Member> = self
            .view
            .takeovers
            .keys()
            .filter(|m| !self.departed.contains_key(*m))
            .cloned()
            .collect();
        // A record that came can hand on the key of an object a running watch showed already (its
        // holder's successor departed in turn: the object may be this replica's now, or drained for
        // it), and one that went can end such a chain. No event tells it, so those watches list again
        // and every object they select is routed under the new view. (CI: an object drained while its
        // worker was a successor that then departed was never let go by the next successor.)
        let continuing: Vec<Member> = if started.is_empty() && ended.is_empty() {
            Vec::new()
        } else {
            self.departed.keys().cloned().collect()
        };
        for member in &continuing {
            self.relist_departed(ctx, member);
        }
        for member in &started {
            self.watch_departed(ctx, member);
        }
        info!(kind = %K::kind(&()), ?started, ?ended, relisted = ?continuing, "take-overs changed");
        if !ended.is_empty() {
            self.watch_own(ctx, true);
        }
    }

    /// Some take-over was listed by every feed: the events held for it are routed, and a gated feed
    /// waiting for the lists routes what it holds.
    pub(super) fn takeovers_listed_by_all(&mut self, ctx: &mut Context<Self>) {
        let Some(shard) = self.runtime.shard.clone() else {
            return;
        };
        let listed: Vec<Member> = self
            .held
            .keys()
            .filter(|member| shard.lists.complete(member))
            .cloned()
            .collect();
        for member in &listed {
            self.replay(ctx, member);
        }
        if self.reroute_pending && self.takeovers_listed() {
            self.reroute(ctx);
        }
    }

    /// Whether every feed listed the objects of every departed member taken over from.
    pub(super) fn takeovers_listed(&self) -> bool {
        let Some(shard) = &self.runtime.shard else {
            return true;
        };
        self.view
            .takeovers
            .keys()
            .all(|member| shard.lists.complete(member))
    }

    /// Gated: routes what the feed holds under the current view, where that changes who works on it.
    pub(super) fn reroute(&mut self, ctx: &mut Context<Self>) {
        if !std::mem::take(&mut self.reroute_pending) {
            // Done already, when the lists completed.
            return;
        }
        let moved: Vec<K> = self
            .latest
            .iter()
            .filter(|(key, object)| match self.shard_of(object.meta()) {
                ShardState::Ours => !self.working.contains(*key),
                // Drained for this replica, which lets it go even if it never worked on it: a take-over
                // can find the departed member's object drained already (a member joined meanwhile),
                // and nothing else would release it (a HostedCluster may not change for hours).
                ShardState::NotOurs { drained } => drained || self.working.contains(*key),
            })
            .map(|(_, object)| object.clone())
            .collect();
        info!(kind = %K::kind(&()), objects = moved.len(), "take-overs changed; routing what moved");
        for object in moved {
            self.route(ctx, &WatchSource::Own, object, false);
        }
    }

    /// Routes the held events of `departed`'s watch, in order (every feed listed its objects, or the
    /// hold's limit passed); from then on its events are routed as they come.
    pub(super) fn replay(&mut self, ctx: &mut Context<Self>, departed: &Member) {
        let Some(events) = self.held.remove(departed) else {
            return;
        };
        let source = WatchSource::Departed(departed.clone());
        for event in events {
            self.dispatch(ctx, &source, event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::ListSemantic;

    #[test]
    fn a_departed_watch_lists_from_the_watch_cache() {
        let config = departed_watch_config("b-1");
        // kube sends resourceVersion=0 (the watch cache) only with Any and no page size.
        assert_eq!(config.list_semantic, ListSemantic::Any);
        assert_eq!(config.page_size, None);
        assert_eq!(
            config.label_selector.as_deref(),
            Some(format!("{SHARD_OWNER_LABEL}=b-1").as_str())
        );
    }
}
