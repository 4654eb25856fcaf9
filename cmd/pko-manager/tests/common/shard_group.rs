//! A shard group run by a test binary of its own (another group's coordinator would relabel the same
//! objects): its member Leases' namespace, the replicas' arguments, and waiting for a replica to
//! coordinate.

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use pko_testenv::{sharded_manager_args, wait_until, ManagerProcess, SHARD_COORDINATOR_LEASE};

use super::{env, TIMEOUT};

/// A fresh Lease namespace (named after `prefix`) and the arguments of replicas whose Leases last
/// `lease_seconds`.
pub async fn shard_group(prefix: &str, lease_seconds: u64) -> (Api<Lease>, Vec<String>) {
    let client = env().management().client().await.unwrap();
    let lease_ns = env().management().create_namespace(prefix).await.unwrap();
    let args = sharded_manager_args(&lease_ns, lease_seconds);
    (Api::namespaced(client, &lease_ns), args)
}

/// Waits until `replica` holds the coordinator's Lease.
pub async fn wait_coordinating(leases: &Api<Lease>, replica: &ManagerProcess) {
    let pid = format!("-{}", replica.pid().unwrap());
    wait_until("the replica coordinates", TIMEOUT, || async {
        let holder = leases
            .get_opt(SHARD_COORDINATOR_LEASE)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default();
        if holder.ends_with(&pid) {
            Ok(())
        } else {
            Err(holder)
        }
    })
    .await
    .unwrap();
}
