//! The fleet of management clusters: this manager's link to the hub NATS its own NATS is a leaf of (the
//! aggregate rollout stream, the cluster and rollout records promotion gates read).

pub mod hub_link;
