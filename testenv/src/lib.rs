//! The real servers pko runs against, started on free loopback ports for tests, the loadtest and the
//! local environment launcher:
//!
//! - one etcd, shared by every apiserver through distinct `--etcd-prefix`es;
//! - a management kube-apiserver, optionally with kube-controller-manager (garbage collection,
//!   namespace deletion);
//! - N hosted-cluster kube-apiservers, each standing in for a HyperShift guest cluster;
//! - nats-server with JetStream;
//! - an OCI registry (distribution).
//!
//! [`shared()`] gives every test of one test binary the same running set, so a binary pays the start-up
//! once; tests isolate themselves with [`ApiServer::create_namespace`]. [`TestEnv::start`] gives an
//! owned set that is torn down when dropped. Server processes die with the process that started them,
//! also when a test panics or the runner is killed.
//!
//! This crate starts and stops servers and hands out clients; it knows nothing of pko's behaviour.

mod apiserver;
mod binaries;
mod connector;
mod connector_runner;
mod controller_manager;
mod crds;
mod env;
mod error;
mod etcd;
mod hypershift;
mod kubeconfig;
mod manager;
mod nats;
mod net;
mod process;
mod registry;
mod wait;
mod webhook;

pub use apiserver::ApiServer;
pub use binaries::Binaries;
pub use connector::{ConnectorLaunch, ConnectorProcess};
pub use connector_runner::ConnectorRunner;
pub use crds::install_crds;
pub use env::{shared, shared_with, EnvConfig, StartupTimings, TestEnv};
pub use error::TestEnvError;
pub use hypershift::{SimulatedHostedCluster, HOSTED_CLUSTERS_NAMESPACE, KUBECONFIG_SECRET};
pub use manager::ManagerProcess;
pub use nats::Nats;
pub use registry::{Registry, REGISTRY_PASSWORD, REGISTRY_USER};
pub use wait::wait_until;
