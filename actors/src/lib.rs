//! pko's object engine and the actor system that drives it.
//!
//! `engine` is the functional core (probes, adoption, desired objects, status, hashing): plain functions,
//! tested without a server. `applier` and the reconcile modules do the apiserver I/O the engine decides on.
//! The actor modules hold state, timers and routing, and call the two.

pub mod engine;
