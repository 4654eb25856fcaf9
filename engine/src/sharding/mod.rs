//! Horizontal sharding: which replica works on which object, and when a Lease has run out (by this
//! process's own observation).

pub mod lease_expiry;
pub mod shard_assignment;
