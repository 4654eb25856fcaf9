//! What the runtime itself reads of the context the actors share: the apiserver clients, the feeds' sync
//! state, the Events sink, this replica's shard membership and the runtime's metrics. The composition
//! root's context carries it and says so through [`SharedContext`]; the runtime knows nothing else of it.

use std::sync::Arc;

use kube::Client;

use crate::engine::sharding::shard_assignment::ShardView;
use crate::runtime::event_sink::EventSink;
use crate::runtime::feed_sync::FeedSync;
use crate::runtime::initial_lists::InitialLists;
use crate::runtime::runtime_metrics::RuntimeMetrics;
use crate::runtime::takeover_lists::TakeoverLists;

/// The runtime's part of the shared context; cheap to clone.
#[derive(Clone)]
pub struct RuntimeContext {
    pub client: Client,
    /// The watch feeds' lists and watches: a queue of their own, so the lists of a take-over never wait
    /// behind the reconciles the objects listed before them start.
    pub watch_client: Client,
    /// How the watches read what exists when they start.
    pub initial_lists: InitialLists,
    /// Whether the watch feeds have listed their kinds (readiness).
    pub feeds: FeedSync,
    /// Where the Kubernetes Events the manager raises go.
    pub events: EventSink,
    /// This replica's membership when the manager runs sharded: it works only on objects labelled for
    /// it (`SHARD_OWNER_LABEL`); `None` in leader-election mode, where the leader works on everything.
    pub shard: Option<ShardContext>,
    pub metrics: RuntimeMetrics,
}

/// A sharded replica: its member name, which its owner label carries, and the members as it sees them
/// (who works on a departed member's objects).
#[derive(Clone)]
pub struct ShardContext {
    pub member: Arc<str>,
    pub view: tokio::sync::watch::Receiver<ShardView>,
    /// Which take-overs the feeds have listed.
    pub lists: TakeoverLists,
}

/// The context a controller's actors share, as the runtime sees it.
pub trait SharedContext: Clone + Unpin + 'static {
    fn runtime(&self) -> &RuntimeContext;
}
