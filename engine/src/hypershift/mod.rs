//! Hosted clusters: teardown of hosted objects through a connector, and how often a connector may wake
//! its namespace's phases.

pub mod connector_deployment;
pub mod hosted_phase;
pub mod hosted_teardown;
pub mod wake_limit;
