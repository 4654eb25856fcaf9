//! Rollout events sent to HTTP sinks as CloudEvents: which sinks a HostedClusterPackage (or the manager)
//! names, what each wants, which addresses they may reach, and what an HTTP answer means for a
//! delivery. No I/O.

pub mod notification_sink;
pub mod sink_address;
