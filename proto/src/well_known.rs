//! Well-known label, annotation and finalizer names pko puts on objects: the one place they are spelled.

/// Label on a package's objects and ObjectDeployment: the name of its PackageManifest.
pub const PACKAGE_LABEL: &str = "package-operator.run/package";
/// Label on a package's objects and ObjectDeployment: the name of the Package instance.
pub const INSTANCE_LABEL: &str = "package-operator.run/instance";

/// Annotation carrying the revision that last applied an object.
pub const REVISION_ANNOTATION: &str = "package-operator.run/revision";

/// Label selecting the objects pko manages; the per-kind watches filter on it.
pub const CACHE_LABEL: &str = "package-operator.run/cache";

/// Annotation recording owners that live in another cluster (hosted-cluster phases), where ownerReferences
/// cannot point: a JSON list of `{apiVersion, kind, name, namespace, uid, controller}`.
pub const OWNERS_ANNOTATION: &str = "package-operator.run/owners";

/// Annotation recording the image a deployment was unpacked from.
pub const SOURCE_IMAGE_ANNOTATION: &str = "package-operator.run/package-source-image";

/// Label naming the class of a delegated phase.
pub const PHASE_CLASS_LABEL: &str = "package-operator.run/phase-class";

/// The phase class the manager reconciles itself.
pub const DEFAULT_PHASE_CLASS: &str = "default";
/// The phase class applied to a hosted cluster by the connector in the phase's HCP namespace.
pub const HOSTED_CLUSTER_PHASE_CLASS: &str = "hosted-cluster";

/// Label linking an ObjectSet to its deployment.
pub const DEPLOYMENT_LABEL: &str = "package-operator.run/object-deployment";

/// Annotation with the template hash of an ObjectSet.
pub const HASH_ANNOTATION: &str = "package-operator.run/hash";

/// Name of every connector object pko creates in an HCP namespace (ServiceAccount, Role, RoleBinding,
/// Deployment). Reserved: no owner's objects may take it (`engine::objects::reserved_objects`).
pub const CONNECTOR_NAME: &str = "pko-connector";
/// Name of the Secret with a connector's NATS credentials, in its HCP namespace. Reserved like
/// [`CONNECTOR_NAME`].
pub const CONNECTOR_CREDENTIALS_SECRET: &str = "pko-connector-nats";

/// pko extension on a namespaced owner (Package, ObjectDeployment, ObjectSet, ObjectSetPhase,
/// ObjectTemplate): the ServiceAccount of its own namespace whose rights its objects are read and written
/// with. Carried down from a Package to its ObjectDeployment and from an ObjectDeployment to its ObjectSets.
pub const SERVICE_ACCOUNT_ANNOTATION: &str = "package-operator.run/service-account";

/// Label on a ServiceAccount (value `"true"`): owners of its namespace may name it in
/// [`SERVICE_ACCOUNT_ANNOTATION`]. Without it the manager does not act as it for them, so a tenant
/// limited to ObjectSets cannot borrow, say, a CI account's rights.
pub const SERVICE_ACCOUNT_OPT_IN_LABEL: &str = "package-operator.run/owners-may-use";

/// Label on every connector object (value `True`).
pub const CONNECTOR_LABEL: &str = "package-operator.run/connector";

/// Annotation on [`CONNECTOR_CREDENTIALS_SECRET`]: the NATS account that signed the credentials.
pub const ACCOUNT_ANNOTATION: &str = "package-operator.run/nats-account";
/// On the connector credentials Secret: Unix time at which its credentials expire.
pub const CREDENTIALS_EXPIRY_ANNOTATION: &str = "package-operator.run/credentials-expire-at";
/// On the connector credentials Secret: UID of the HostedCluster they were minted for.
pub const CREDENTIALS_CLUSTER_ANNOTATION: &str = "package-operator.run/hosted-cluster-uid";

/// Annotation on the pod template: changes when the credentials do, so the pods restart with them.
pub const CREDENTIALS_HASH_ANNOTATION: &str = "package-operator.run/credentials-hash";

/// Label on every Package a HostedClusterPackage owns: its name.
pub const HOSTED_CLUSTER_PACKAGE_LABEL: &str = "package-operator.run/hosted-cluster-package";

/// On a HostedClusterPackage: approvals of its partition groups, a JSON object
/// `{"<group>": {"templateHash": "…", "approvedBy": "…", "approvedAt": "…"}}`
/// ([`crate::core::hosted_cluster_package::RolloutApproval`]), written by `kubectl package rollout approve`.
/// An approval counts only for the template hash it names.
pub const ROLLOUT_APPROVALS_ANNOTATION: &str = "rollout.package-operator.run/approvals";

/// On a HostedClusterPackage: the template hash a rollback was asked for (`kubectl package rollout undo`).
pub const ROLLOUT_UNDO_ANNOTATION: &str = "rollout.package-operator.run/undo";

/// On a HostedClusterPackage: the acceptance of a preflight's refusals (a
/// [`crate::core::hosted_cluster_package::RolloutApproval`] naming the template hash and the preflight
/// digest), written by `kubectl package rollout approve --preflight`.
pub const ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION: &str =
    "rollout.package-operator.run/preflight-approval";

/// On a HostedClusterPackage: asks for a new preflight (any value not seen before).
pub const ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION: &str = "rollout.package-operator.run/preflight";

/// Label on a HostedCluster: the maintenance window (`spec.rolloutPolicy.maintenanceWindows[].name`)
/// outside which no HostedClusterPackage creates or updates its Package. Set once by the cluster's owner
/// for every HostedClusterPackage.
pub const MAINTENANCE_WINDOW_LABEL: &str = "rollout.package-operator.run/maintenance-window";

/// Label on a Secret in the manager's namespace: `"true"` lets HostedClusterPackage notification sinks
/// (`spec.rolloutPolicy.notifications[].credentialsSecret`) and the manager-wide sink use it. Without it
/// the manager sends no Secret of its namespace anywhere.
pub const SINK_CREDENTIALS_LABEL: &str = "rollout.package-operator.run/sink-credentials";
/// Annotation on a sink credentials Secret: the URL origins (`https://hooks.example.com`, comma-separated)
/// its credentials may be sent to. A sink at any other origin gets no credentials from it.
pub const SINK_ORIGINS_ANNOTATION: &str = "rollout.package-operator.run/sink-origins";

/// Annotation naming the phase of an object (required).
pub const PHASE_ANNOTATION: &str = "package-operator.run/phase";

/// Annotation setting an object's collision protection.
pub const COLLISION_ANNOTATION: &str = "package-operator.run/collision-protection";

/// Annotation with condition mappings, one `SourceType => domain/DestinationType` per line.
pub const CONDITION_MAP_ANNOTATION: &str = "package-operator.run/condition-map";

/// Annotation holding an object's own condition.
pub const CONDITION_ANNOTATION: &str = "package-operator.run/condition";

/// Annotation `pause` leaves the reason in.
pub const PAUSE_MESSAGE_ANNOTATION: &str = "package-operator.run/pause-message";

/// Keeps a set (and a default-class ObjectSetPhase) until its objects are torn down, so deleting it tears
/// down as archival does instead of leaving its objects to the garbage collector.
pub const TEARDOWN_FINALIZER: &str = "package-operator.run/teardown";
/// The finalizer the apiserver adds to an object deleted with `propagationPolicy: Orphan`; the garbage
/// collector removes it once the object's dependents no longer reference it.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// Held on hosted-cluster ObjectSetPhases until their hosted objects are torn down.
pub const HOSTED_TEARDOWN_FINALIZER: &str = "package-operator.run/hosted-cluster-teardown";

/// Annotation on a Package choosing how its objects are cut into ObjectSlices.
pub const CHUNKING_ANNOTATION: &str = "packages.package-operator.run/chunking-strategy";

/// Label on every slice: the deployment it was cut for.
pub const SLICE_OWNER_LABEL: &str = "slices.package-operator.run/owner";

/// On every object a sharded manager reconciles: the replica (its member Lease's holder) that works on it.
pub const SHARD_OWNER_LABEL: &str = "shard.package-operator.run/owner";

/// Set by the shard coordinator when the owner is to let the object go; the owner stops its actor for it
/// and removes both shard labels.
pub const SHARD_DRAIN_LABEL: &str = "shard.package-operator.run/drain";

/// The name of a sharded replica's member Lease: `pko-shard-` and its identity in lower-case letters,
/// digits and '-' (the manager creates it; the write audit of the tests reads it).
pub fn shard_member_lease(identity: &str) -> String {
    let suffix: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    format!("pko-shard-{suffix}")
}

/// The member a shard Lease's holder identity (or a manager's user agent identity) is a process of:
/// `<member>/<process>` for a member name that outlives the process, else the identity itself.
pub fn holder_member(holder: &str) -> &str {
    holder.split_once('/').map_or(holder, |(member, _)| member)
}

/// Label on every shard member Lease; its value is the member's name (the holder is cleared when it
/// leaves).
pub const SHARD_MEMBER_LABEL: &str = "package-operator.run/shard-member";
/// Annotation the shard coordinator writes onto a departed member's Lease: the members, comma-separated,
/// among which its keys are taken over.
pub const SHARD_SUCCESSORS_ANNOTATION: &str = "shard.package-operator.run/successors";
/// Annotation a replica with a stable member name writes onto its Lease as it stops (its value: the
/// process that stopped): it comes back under the same name, so the others keep counting it a member
/// for the Lease's duration instead of taking its keys over. The restarted process removes it.
pub const SHARD_RESTARTING_ANNOTATION: &str = "shard.package-operator.run/restarting";

/// Annotation carrying the W3C `traceparent` of the span that wrote an object, so the actor that observes
/// the write through its watch continues the same trace (docs/observability.md).
pub const TRACE_PARENT_ANNOTATION: &str = "pko.run/traceparent";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lease_names_are_valid_object_names() {
        assert_eq!(
            shard_member_lease("pko-manager-7d9f-x2"),
            "pko-shard-pko-manager-7d9f-x2"
        );
        assert_eq!(
            shard_member_lease("Host_Name.1-42"),
            "pko-shard-host-name-1-42"
        );
    }
}
