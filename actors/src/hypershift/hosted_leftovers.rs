//! Hosted objects a given-up teardown left behind. When a deleted hosted phase's connector stays
//! unreachable past the teardown timeout, the phase is let go (`remote_phase_actor`), but its objects
//! are still in the hosted cluster. Its teardown request is recorded in the HCP namespace's ConfigMap
//! `pko-hosted-leftovers` (one key per deleted phase UID; objects reduced to their references) and swept
//! when the namespace's connector says hello again: each recorded teardown is sent, and its key goes once
//! the connector reports it torn down. The connector deletes only objects whose owner is that phase UID,
//! so a swept record never touches another phase's objects.
//!
//! Who can reach it: anyone allowed to write ConfigMaps in the HCP namespace can add keys. A key naming a
//! phase that still exists (a live phase's UID) is dropped unsent, so a forged record cannot tear down a
//! live phase; a key naming a UID nothing owns deletes nothing. It must not decide when a teardown is
//! given up (`engine::hypershift::hosted_teardown` does).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use pko_proto::connector_wire::{
    HostedClusterSubjects, PhaseOutcome, PhaseRef, PhaseReport, Reply, TeardownPhase, WIRE_VERSION,
};
use pko_proto::core::common::ObjectSetObject;
use pko_proto::core::object_set_phase::ObjectSetPhase;
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::hypershift::connector_link::ConnectorLink;

/// The ConfigMap of an HCP namespace that records given-up teardowns.
pub const LEFTOVERS_CONFIGMAP: &str = "pko-hosted-leftovers";

/// The teardown request to keep for `phase`: its objects reduced to what names them.
pub fn leftover_request(phase: PhaseRef, objects: &[ObjectSetObject]) -> TeardownPhase {
    let objects = objects
        .iter()
        .map(|o| {
            let text = |pointer: &str| o.object.pointer(pointer).cloned().unwrap_or(Value::Null);
            ObjectSetObject {
                object: json!({
                    "apiVersion": text("/apiVersion"),
                    "kind": text("/kind"),
                    "metadata": {
                        "name": text("/metadata/name"),
                        "namespace": text("/metadata/namespace"),
                    },
                }),
                collision_protection: o.collision_protection.clone(),
                condition_mappings: Vec::new(),
            }
        })
        .collect();
    TeardownPhase {
        version: WIRE_VERSION,
        phase,
        objects,
    }
}

/// Records `request` in its namespace's leftovers ConfigMap.
pub async fn record(client: &Client, request: &TeardownPhase) -> Result<(), kube::Error> {
    let namespace = &request.phase.namespace;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let value = serde_json::to_string(request).map_err(kube::Error::SerdeError)?;
    let patch = json!({"data": {request.phase.uid.clone(): value}});
    match api
        .patch(
            LEFTOVERS_CONFIGMAP,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let map = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(LEFTOVERS_CONFIGMAP.to_owned()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(request.phase.uid.clone(), value)])),
                ..Default::default()
            };
            // Created meanwhile by another record: 409, and the next attempt patches it.
            api.create(&PostParams::default(), &map).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// Torn down by the connector; their keys removed.
    pub swept: usize,
    /// Dropped unsent: unreadable, or naming a phase that exists.
    pub dropped: usize,
    /// Still there (the connector did not finish or answer): swept at its next hello.
    pub left: usize,
}

/// Sends every recorded teardown of `namespace` to its connector over `subjects`.
pub async fn sweep(
    client: &Client,
    link: &ConnectorLink,
    namespace: &str,
    subjects: &HostedClusterSubjects,
) -> Result<Sweep, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let Some(map) = api
        .get_opt(LEFTOVERS_CONFIGMAP)
        .await
        .map_err(|e| format!("reading {LEFTOVERS_CONFIGMAP}: {e}"))?
        .filter(|m| m.data.as_ref().is_some_and(|d| !d.is_empty()))
    else {
        return Ok(Sweep::default());
    };
    // The phases that exist: a record naming one of them is never sent.
    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), namespace);
    let live: HashSet<String> = phases
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| format!("listing ObjectSetPhases: {e}"))?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    let live = |uid: &str| live.contains(uid);
    let mut sweep = Sweep::default();
    let mut done: Vec<String> = Vec::new();
    for (uid, value) in map.data.unwrap_or_default() {
        let request = serde_json::from_str::<TeardownPhase>(&value)
            .ok()
            .filter(|r| r.phase.uid == uid && r.phase.namespace == namespace);
        let Some(request) = request.filter(|_| !live(&uid)) else {
            warn!(namespace, %uid, "dropping a leftovers record that is unreadable or names a live phase");
            sweep.dropped += 1;
            done.push(uid);
            continue;
        };
        match link
            .request::<_, PhaseReport>(subjects.teardown(), &request)
            .await
        {
            Ok(Reply::Answer(report)) if report.outcome == PhaseOutcome::TornDown => {
                info!(namespace, phase = %request.phase.name, "swept the hosted objects a given-up teardown left");
                sweep.swept += 1;
                done.push(uid);
            }
            Ok(_) | Err(_) => sweep.left += 1,
        }
    }
    if !done.is_empty() {
        let removed: serde_json::Map<String, Value> =
            done.into_iter().map(|uid| (uid, Value::Null)).collect();
        api.patch(
            LEFTOVERS_CONFIGMAP,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": removed})),
        )
        .await
        .map_err(|e| format!("removing swept records from {LEFTOVERS_CONFIGMAP}: {e}"))?;
    }
    Ok(sweep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_request_names_the_objects_and_nothing_else() {
        let object = ObjectSetObject {
            object: json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "default", "labels": {"a": "b"}},
                "data": {"big": "x".repeat(10_000)}}),
            ..Default::default()
        };
        let phase = PhaseRef {
            namespace: "clusters-a".into(),
            name: "rev-1-deploy".into(),
            uid: "u-1".into(),
            generation: 2,
        };
        let request = leftover_request(phase.clone(), &[object]);
        assert_eq!(request.phase, phase);
        assert_eq!(
            request.objects[0].object,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "default"}})
        );
    }
}
