//! One view of ObjectSet, ClusterObjectSet and the ObjectSetPhases the manager reconciles itself (class
//! `default`), so a single actor and planner serve all four kinds: an ObjectSetPhase is a set with exactly
//! one phase whose revision is given, not derived.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use pko_proto::core::common::{
    LifecycleState, ObjectSetObject, ObjectSetTemplatePhase, ObjectSetTemplateSpec,
};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet, ObjectSetSpec, ObjectSetStatus};
use pko_proto::core::object_set_phase::{
    ClusterObjectSetPhase, ObjectSetPhase, ObjectSetPhaseSpec, ObjectSetPhaseStatus,
};
use pko_proto::core::object_slice::{ClusterObjectSlice, ObjectSlice};
use pko_proto::well_known::PHASE_CLASS_LABEL;
use serde_json::json;

use crate::engine::conditions::is_mapped;
use crate::engine::objects::desired_object::OwnerRef;
use crate::engine::objects::object_set_plan::SetToPlan;
use crate::objects::object_meta::requested_service_account;
use crate::objects::object_meta::write_status;
use crate::runtime::meta_view::MetaView;

/// Which kind an object driven by the set actor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetKind {
    Namespaced,
    Cluster,
    Phase,
    ClusterPhase,
}

impl SetKind {
    pub fn kind(self) -> &'static str {
        match self {
            SetKind::Namespaced => "ObjectSet",
            SetKind::Cluster => "ClusterObjectSet",
            SetKind::Phase => "ObjectSetPhase",
            SetKind::ClusterPhase => "ClusterObjectSetPhase",
        }
    }

    pub fn is_phase(self) -> bool {
        matches!(self, SetKind::Phase | SetKind::ClusterPhase)
    }

    pub fn is_namespaced(self) -> bool {
        matches!(self, SetKind::Namespaced | SetKind::Phase)
    }

    /// The ObjectSet kind revisions (`previous`) of this kind refer to.
    pub fn revision_kind(self) -> SetKind {
        if self.is_namespaced() {
            SetKind::Namespaced
        } else {
            SetKind::Cluster
        }
    }

    /// The ObjectSetPhase kind this kind delegates phases to.
    pub fn phase_kind(self) -> SetKind {
        if self.is_namespaced() {
            SetKind::Phase
        } else {
            SetKind::ClusterPhase
        }
    }

    pub fn api_resource(self) -> ApiResource {
        match self {
            SetKind::Namespaced => ApiResource::erase::<ObjectSet>(&()),
            SetKind::Cluster => ApiResource::erase::<ClusterObjectSet>(&()),
            SetKind::Phase => ApiResource::erase::<ObjectSetPhase>(&()),
            SetKind::ClusterPhase => ApiResource::erase::<ClusterObjectSetPhase>(&()),
        }
    }

    /// API for objects of this kind in `namespace` (ignored for cluster-scoped kinds).
    pub fn api(self, client: Client, namespace: &str) -> Api<DynamicObject> {
        if self.is_namespaced() {
            Api::namespaced_with(client, namespace, &self.api_resource())
        } else {
            Api::all_with(client, &self.api_resource())
        }
    }

    /// The part of a set status this kind has: ObjectSetPhases carry only conditions (Available, Paused
    /// and mapped ones) and controllerOf.
    pub fn status_view(self, mut status: ObjectSetStatus) -> ObjectSetStatus {
        if self.is_phase() {
            status.phase = None;
            status.revision = 0;
            status.remote_phases.clear();
            status
                .conditions
                .retain(|c| c.type_ == "Available" || c.type_ == "Paused" || is_mapped(&c.type_));
        }
        status
    }
}

/// An ObjectSet, ClusterObjectSet or ObjectSetPhase as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SetObject {
    pub kind: SetKind,
    pub meta: ObjectMeta,
    pub spec: ObjectSetSpec,
    pub status: ObjectSetStatus,
    /// The revision the spec gives: an ObjectSetPhase's, or an ObjectSet's `spec.revision`; `None` when a
    /// set derives its own.
    pub given_revision: Option<i64>,
}

impl From<ObjectSet> for SetObject {
    fn from(o: ObjectSet) -> Self {
        Self {
            kind: SetKind::Namespaced,
            given_revision: o.spec.revision.filter(|r| *r > 0),
            meta: o.metadata,
            spec: o.spec,
            status: o.status.unwrap_or_default(),
        }
    }
}

impl From<ClusterObjectSet> for SetObject {
    fn from(o: ClusterObjectSet) -> Self {
        Self {
            kind: SetKind::Cluster,
            given_revision: o.spec.revision.filter(|r| *r > 0),
            meta: o.metadata,
            spec: o.spec,
            status: o.status.unwrap_or_default(),
        }
    }
}

fn from_phase(
    kind: SetKind,
    meta: ObjectMeta,
    spec: ObjectSetPhaseSpec,
    status: Option<ObjectSetPhaseStatus>,
) -> SetObject {
    let status = status.unwrap_or_default();
    SetObject {
        kind,
        spec: ObjectSetSpec {
            lifecycle_state: if spec.paused {
                LifecycleState::Paused
            } else {
                LifecycleState::Active
            },
            previous: spec.previous,
            // The phase's revision travels in `given_revision`.
            revision: None,
            template: ObjectSetTemplateSpec {
                phases: vec![ObjectSetTemplatePhase {
                    name: meta.name.clone().unwrap_or_default(),
                    class: String::new(),
                    objects: spec.objects,
                    external_objects: spec.external_objects,
                    slices: Vec::new(),
                }],
                availability_probes: spec.availability_probes,
                success_delay_seconds: 0,
            },
        },
        status: ObjectSetStatus {
            conditions: status.conditions,
            controller_of: status.controller_of,
            ..ObjectSetStatus::default()
        },
        given_revision: Some(spec.revision),
        meta,
    }
}

impl From<ObjectSetPhase> for SetObject {
    fn from(o: ObjectSetPhase) -> Self {
        from_phase(SetKind::Phase, o.metadata, o.spec, o.status)
    }
}

impl From<ClusterObjectSetPhase> for SetObject {
    fn from(o: ClusterObjectSetPhase) -> Self {
        from_phase(SetKind::ClusterPhase, o.metadata, o.spec, o.status)
    }
}

impl MetaView for SetObject {
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn kind(&self) -> &'static str {
        self.kind.kind()
    }
}

impl SetObject {
    /// Owner reference data for the objects this set applies.
    pub fn owner(&self) -> OwnerRef {
        OwnerRef {
            api_version: ObjectSet::api_version(&()).into_owned(),
            kind: self.kind.kind().to_owned(),
            name: self.name().to_owned(),
            uid: self.uid().to_owned(),
            namespace: self
                .kind
                .is_namespaced()
                .then(|| self.namespace().to_owned()),
            remote: false,
        }
    }

    /// What the planner (`engine::objects::object_set_plan`) reads of the set.
    pub fn to_plan(&self) -> SetToPlan<'_> {
        SetToPlan {
            owner: self.owner(),
            phase_kind: self.kind.phase_kind().kind(),
            spec: &self.spec,
            traceparent: self.traceparent(),
            service_account: requested_service_account(&self.meta),
        }
    }

    /// The phase class, for ObjectSetPhases.
    pub fn phase_class(&self) -> Option<&str> {
        self.meta
            .labels
            .as_ref()?
            .get(PHASE_CLASS_LABEL)
            .map(String::as_str)
    }

    /// Name of the object's controller (the ObjectSet of an ObjectSetPhase).
    pub fn controller_name(&self) -> Option<&str> {
        self.controller().map(|r| r.name.as_str())
    }

    /// For an ObjectSetPhase named `<set>-<phase>`, the `<phase>` part: its predecessor in revision
    /// `<previous>` is `<previous>-<phase>`.
    pub fn delegated_phase_name(&self) -> Option<String> {
        let owner = self.controller_name()?;
        self.name()
            .strip_prefix(&format!("{owner}-"))
            .filter(|_| self.kind.is_phase())
            .map(str::to_owned)
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.meta
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == finalizer))
    }

    /// Adds (`present`) or removes `finalizer`; nothing to do is no write. Guarded by the observed
    /// resourceVersion: a concurrent change makes it fail with 409, and the next observation retries.
    pub async fn set_finalizer(
        &self,
        client: Client,
        finalizer: &str,
        present: bool,
    ) -> Result<(), kube::Error> {
        if self.has_finalizer(finalizer) == present {
            return Ok(());
        }
        let mut finalizers: Vec<String> = self
            .meta
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        if present {
            finalizers.push(finalizer.to_owned());
        }
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": self.meta.resource_version,
        }});
        self.kind
            .api(client, self.namespace())
            .patch(self.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Writes `status` through the status subresource (the ObjectSetPhase form for phases).
    pub async fn write_status(
        &self,
        client: Client,
        status: &ObjectSetStatus,
    ) -> Result<(), kube::Error> {
        let api = self.kind.api(client, self.namespace());
        if self.kind.is_phase() {
            let phase_status = ObjectSetPhaseStatus {
                conditions: status.conditions.clone(),
                controller_of: status.controller_of.clone(),
            };
            write_status(
                &api,
                self.name(),
                &phase_status,
                &["conditions", "controllerOf"],
            )
            .await
        } else {
            let lists = ["conditions", "controllerOf", "remotePhases"];
            write_status(&api, self.name(), status, &lists).await
        }
    }

    /// Reads the objects of an ObjectSlice (ClusterObjectSlice for cluster sets), `None` if it is missing,
    /// and makes this set an owner of the slice (a plain owner reference: several revisions may share a
    /// slice; it is garbage-collected once none of them is left).
    pub async fn use_slice(
        &self,
        client: Client,
        name: &str,
    ) -> Result<Option<Vec<ObjectSetObject>>, kube::Error> {
        let resource = if self.kind.is_namespaced() {
            ApiResource::erase::<ObjectSlice>(&())
        } else {
            ApiResource::erase::<ClusterObjectSlice>(&())
        };
        let api: Api<DynamicObject> = if self.kind.is_namespaced() {
            Api::namespaced_with(client, self.namespace(), &resource)
        } else {
            Api::all_with(client, &resource)
        };
        let Some(slice) = api.get_opt(name).await? else {
            return Ok(None);
        };
        let objects: Vec<ObjectSetObject> = slice
            .data
            .get("objects")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(kube::Error::SerdeError)?
            .unwrap_or_default();
        let mut owners = slice.metadata.owner_references.clone().unwrap_or_default();
        if !owners.iter().any(|o| o.uid == self.uid()) {
            let me = self.owner();
            owners.push(OwnerReference {
                api_version: me.api_version,
                kind: me.kind,
                name: me.name,
                uid: me.uid,
                controller: None,
                block_owner_deletion: None,
            });
            let patch = json!({"metadata": {
                "ownerReferences": owners,
                "resourceVersion": slice.metadata.resource_version,
            }});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(Some(objects))
    }
}
