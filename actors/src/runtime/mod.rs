//! The actor runtime the domains share: its part of the shared context, watch feeds and their routing registry,
//! the relations that let one kind's changes wake another kind's actors,
//! the reconcile shell every object actor runs in (`object_actor`: gate, span, metrics, backoff), the
//! one task Kubernetes Events leave through (`event_sink`), the
//! leader Lease and the write fence it keeps open, the rate-limited apiserver client and process
//! start-up. It holds no reconcile rules of any kind; the wiring of the domains is `manager/`.

pub mod api_request_metrics;
pub mod cluster_client;
pub mod event_sink;
pub mod feed_sync;
pub mod heap_trim;
pub mod initial_lists;
pub mod kind_feed;
pub mod known_objects;
pub mod leader_lease;
pub mod lease_metrics;
pub mod meta_view;
pub mod object_actor;
pub mod observer_clock;
pub mod process_main;
pub mod reconcile_gate;
pub mod registry;
pub mod relations;
pub mod runtime_context;
pub mod runtime_metrics;
pub mod shard_coordinator;
pub mod shard_membership;
pub mod shard_metrics;
pub mod takeover_lists;
pub mod telemetry;
pub mod write_fence;
