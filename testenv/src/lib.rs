//! The real servers pko runs against, started on free loopback ports for tests, the loadtest and the
//! local environment launcher:
//!
//! - one etcd, shared by every apiserver through distinct `--etcd-prefix`es;
//! - a management kube-apiserver, optionally with kube-controller-manager (garbage collection,
//!   namespace deletion);
//! - N hosted-cluster kube-apiservers, each standing in for a HyperShift guest cluster;
//! - nats-server with JetStream;
//! - an OCI registry (distribution);
//! - Prometheus, on request, scraping what a test names;
//! - an OTLP trace receiver (gRPC and HTTP/protobuf), on request.
//!
//! [`shared()`] gives every test of one test binary the same running set, so a binary pays the start-up
//! once; tests isolate themselves with [`ApiServer::create_namespace`]. [`TestEnv::start`] gives an
//! owned set that is torn down when dropped. Server processes die with the process that started them,
//! also when a test panics or the runner is killed.
//!
//! This crate starts and stops servers and hands out clients; it knows nothing of pko's behaviour.
//!
//! Everything but the registries needs the `cluster` feature (it links the NATS client); without it the
//! crate offers [`shared_registries()`] only, so the package CLI's tests pull in no NATS client.

mod binaries;
mod command;
mod error;
mod net;
mod process;
mod registry;
mod wait;
mod workdir;

/// Items that need the `cluster` feature.
macro_rules! cluster_only {
    ($($item:item)*) => { $( #[cfg(feature = "cluster")] $item )* };
}

cluster_only! {
    mod apiserver;
    mod connector;
    mod configured_nats;
    mod connector_runner;
    mod controller_manager;
    mod crds;
    mod dashboard;
    mod env;
    mod etcd;
    mod hypershift;
    mod kubeconfig;
    mod manager;
    mod nats;
    mod otlp_receiver;
    mod prometheus;
    mod stall_proxy;
    mod write_audit;
    pub mod workload;

    pub use apiserver::ApiServer;
    pub use connector::{ConnectorLaunch, ConnectorProcess};
    pub use connector_runner::ConnectorRunner;
    pub use crds::install_crds;
    pub use dashboard::{Dashboard, PanelData};
    pub use env::{shared, shared_with, EnvConfig, StartupTimings, TestEnv};
    pub use kubeconfig::client as client_for;
    pub use hypershift::{
        add_hosted_cluster_to, connect_hosted_cluster, install_hosted_cluster_crd,
        SimulatedHostedCluster, HOSTED_CLUSTERS_NAMESPACE, KUBECONFIG_SECRET,
    };
    pub use manager::{
        fleet_manager_args, sharded_manager_args, ManagerLaunch, ManagerProcess,
        MANAGER_NAMESPACE, SHARD_COORDINATOR_LEASE,
    };
    pub use configured_nats::FleetNats;
    pub use nats::{Nats, StoredEvent};
    pub use otlp_receiver::{span_tree, OtlpReceiver, ReceivedSpan};
    pub use prometheus::{Prometheus, Sample, Series};
    pub use stall_proxy::{StallLink, StallProxy};
    pub use write_audit::{manager_creates, member_processes, shard_write_audit, WriteAudit};
}

pub use binaries::{kubectl, platform_dir, Binaries};
pub use command::run_with_input;
pub use error::TestEnvError;
pub use net::http_get;
pub use registry::{shared_registries, Registries, Registry, REGISTRY_PASSWORD, REGISTRY_USER};
pub use wait::wait_until;
