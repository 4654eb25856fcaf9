//! The fleet of management clusters: promotion gates read from the hub's records, poisoned releases.

pub mod promotion_gate;
