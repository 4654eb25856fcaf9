//! The actor runtime the domains share: the manager context, watch feeds and their routing registry,
//! the reconcile shell every object actor runs in (`object_actor`: gate, span, metrics, backoff), the
//! one task Kubernetes Events leave through (`event_sink`), the
//! leader Lease and the write fence it keeps open, the rate-limited apiserver client, process
//! start-up, and `manager.rs`, which wires every domain's feeds and actors together. It holds no
//! reconcile rules of any kind.

pub mod cluster_client;
pub mod context;
pub mod event_sink;
pub mod feed_sync;
pub mod kind_feed;
pub mod leader_lease;
pub mod manager;
pub mod meta_view;
pub mod object_actor;
pub mod observer_clock;
pub mod process_main;
pub mod reconcile_gate;
pub mod registry;
pub mod shard_coordinator;
pub mod shard_membership;
pub mod takeover_lists;
pub mod telemetry;
pub mod write_fence;
