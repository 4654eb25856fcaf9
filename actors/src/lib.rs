//! pko's manager and connector: the engine's rules and the actors that drive them, a folder per domain.
//!
//! The functional core lives in its own crate, `pko-engine` (re-exported here as `engine`, so the CLI can
//! run the same rollout planner without the actor runtime): (probes, adoption, desired objects, status, rollout plans, hashing):
//! plain functions, tested without a server. The domains do the I/O, timers and messages around it:
//! `objects/` (ObjectSet, phases, ObjectDeployment, ObjectTemplate), `packages/` (Package actors),
//! `hypershift/` (HostedClusters, connectors, remote phases), `rollout/` (HostedClusterPackage),
//! `fleet/` (the hub of management clusters), `metrics/` (what /metrics exposes), all on `runtime/` (context, feeds, shell, gate, Lease), wired together by
//! `manager/` (the composition root).

pub mod fleet;
pub mod hypershift;
pub mod manager;
pub mod metrics;
pub mod notifications;
pub mod objects;
pub mod packages;
pub mod rollout;
pub mod runtime;

pub use pko_engine as engine;
