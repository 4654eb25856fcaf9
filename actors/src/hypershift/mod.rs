//! The HyperShift integration: detecting HostedClusters, installing a connector per HCP namespace, the
//! NATS link and hub to the connectors, the manager's remote phase actors, and the connector's own actor.
//! The pure parts (the connector's objects, hosted phases between the wire and the phase engine) are in
//! `engine/hypershift/`. It does not decide rollouts (`rollout/` does).

pub mod connector_actor;
pub mod connector_hub;
pub mod connector_link;
pub mod hosted_cluster_actor;
pub mod hosted_leftovers;
pub mod hypershift_detector;
pub mod remote_phase_actor;
