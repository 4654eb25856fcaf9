//! The supervisor and its object's CloudEvents sinks: started (or changed) as the spec names them while
//! this replica supervises it, stopped when it moves away, and gone, consumers included, with it.

use pko_proto::core::hosted_cluster_package::HostedClusterPackage;

use super::HostedClusterPackageActor;
use crate::engine::notifications::notification_sink::notification_sinks;

impl HostedClusterPackageActor {
    /// The sinks `hcpkg` names now. An invalid list is reported by the decision (InvalidSpec) and
    /// changes nothing here.
    pub(super) fn serve_sinks(&self, hcpkg: &HostedClusterPackage) {
        let Some(sinks) = &self.context.rollouts.sinks else {
            return;
        };
        if let Ok(named) = notification_sinks(hcpkg.spec.rollout_policy.as_ref()) {
            let uid = hcpkg.metadata.uid.as_deref().unwrap_or_default();
            sinks.ensure(&self.name(), uid, &named);
        }
    }

    /// Moved to another replica, or deleted: this one serves its sinks no longer.
    pub(super) fn release_sinks(&self) {
        if let Some(sinks) = &self.context.rollouts.sinks {
            sinks.release(&self.name());
        }
    }

    /// Deleted: its sinks' consumers go too.
    pub(super) fn remove_sinks(&self) {
        let (Some(sinks), Some(hcpkg)) = (&self.context.rollouts.sinks, &self.object) else {
            return;
        };
        let named = notification_sinks(hcpkg.spec.rollout_policy.as_ref()).unwrap_or_default();
        let uid = hcpkg.metadata.uid.as_deref().unwrap_or_default();
        sinks.remove(&self.name(), uid, &named);
    }
}
