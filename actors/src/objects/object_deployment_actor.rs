//! The ObjectDeployment actor: one per ObjectDeployment or ClusterObjectDeployment. Each reconcile lists
//! the deployment's ObjectSets, lets the deployment plan decide (create a revision, bump the collision
//! count, archive and prune old revisions), applies that, and writes status only when it changes. Events of
//! its ObjectSets wake it directly.

use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::common::{ControlledObjectReference, LifecycleState};
use pko_proto::core::object_deployment::ObjectDeploymentStatus;
use serde_json::json;
use tracing::warn;

use crate::engine::adoption::{controller_of, revision_of};
use crate::engine::conditions::{is_mapped, is_true_for};
use crate::engine::deployment_plan::{
    deployment_conditions, plan_deployment, revision_name, DeploymentAction, RevisionView,
};
use crate::engine::template_hash::template_hash;
use crate::engine::transition_events::deployment_transitions;
use crate::metrics::manager_metrics::ManagerMetrics;
use crate::objects::deployment_object::DeploymentObject;
use crate::objects::object_meta::{event_reference, tombstone_meta, MetaView};
use crate::objects::set_object::SetObject;
use crate::runtime::context::ManagerContext;
use crate::runtime::object_actor::{
    work, Change, Notice, ObjectActor, Outcome, Reconcile, Report, Work,
};
use crate::runtime::reconcile_gate::Backoff;
use crate::runtime::registry::ObjectRef;

/// Collision-count bumps within one reconcile before giving up until the next event.
const MAX_COLLISIONS_PER_RUN: usize = 5;

/// One of the deployment's ObjectSets changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RevisionChanged;

fn view(set: &SetObject, owner_uid: &str) -> RevisionView {
    RevisionView {
        template: set.spec.template.clone(),
        ..view_without_template(set, owner_uid)
    }
}

/// What a deployment's reconcile reads of one of its sets, with the set's generation standing for its
/// spec (the template is the bulk of a set and immutable). A set event that leaves this unchanged cannot
/// change the deployment's plan or status, so it need not wake the deployment.
#[derive(Debug, PartialEq)]
pub struct RevisionDigest {
    generation: i64,
    view: RevisionView,
}

impl RevisionDigest {
    pub fn of(set: &SetObject) -> Self {
        let controller = set.controller().map(|o| o.uid.as_str()).unwrap_or_default();
        Self {
            generation: set.generation(),
            view: view_without_template(set, controller),
        }
    }
}

fn view_without_template(set: &SetObject, owner_uid: &str) -> RevisionView {
    let generation = set.generation();
    let conditions = &set.status.conditions;
    let meta = json!({"metadata": {
        "ownerReferences": set.meta.owner_references,
        "annotations": set.meta.annotations,
    }});
    RevisionView {
        name: set.name().to_owned(),
        ours: controller_of(&meta).is_some_and(|(uid, _, _)| uid == owner_uid),
        revision: if set.status.revision > 0 {
            set.status.revision
        } else {
            revision_of(&meta).unwrap_or(0)
        },
        template: Default::default(),
        lifecycle: set.spec.lifecycle_state.clone(),
        available: is_true_for(conditions, "Available", generation),
        unavailable: conditions
            .iter()
            .find(|c| {
                // Objects whose status does not speak for the change yet are on their way, not failing.
                c.type_ == "Available"
                    && c.status == "False"
                    && c.reason != "AwaitingStatus"
                    && c.observed_generation.is_none_or(|g| g == generation)
            })
            .map(|c| c.message.clone()),
        succeeded: is_true_for(conditions, "Succeeded", generation),
        archived: is_true_for(conditions, "Archived", generation),
        mapped: conditions
            .iter()
            .filter(|c| {
                is_mapped(&c.type_) && c.observed_generation.is_none_or(|g| g == generation)
            })
            .cloned()
            .collect(),
    }
}

/// One reconcile; returns the status to publish.
async fn reconcile_deployment(
    context: ManagerContext,
    mut od: DeploymentObject,
) -> Result<ObjectDeploymentStatus, kube::Error> {
    let client = context.client.clone();
    for _ in 0..MAX_COLLISIONS_PER_RUN {
        let count = od.status.collision_count.unwrap_or(0);
        let hash = template_hash(&od.spec.template, count);
        let name = revision_name(od.name(), &hash);
        let sets = od.list_sets(client.clone()).await?;
        let views: Vec<RevisionView> = sets.iter().map(|s| view(s, od.uid())).collect();
        let action = plan_deployment(
            &od.spec.template.spec,
            &name,
            &views,
            od.spec.revision_history_limit,
            od.spec.paused,
        );
        let (current, others): (Option<&RevisionView>, Vec<RevisionView>) = match &action {
            DeploymentAction::BumpCollisionCount => {
                od.status.collision_count = Some(count + 1);
                continue;
            }
            DeploymentAction::Create {
                name,
                revision,
                previous,
            } => {
                match od
                    .create_set(
                        client.clone(),
                        name,
                        &hash,
                        *revision,
                        previous,
                        context.shard.as_ref().map(|s| &*s.member),
                    )
                    .await
                {
                    Ok(()) => {}
                    // A set we could not list (not labelled as ours) holds the name: that is a collision.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        od.status.collision_count = Some(count + 1);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                (None, views.iter().filter(|v| v.ours).cloned().collect())
            }
            DeploymentAction::Hold { pause } => {
                for name in pause {
                    od.set_lifecycle(client.clone(), name, LifecycleState::Paused)
                        .await?;
                }
                let current = views.iter().find(|v| v.name == name);
                let others = views
                    .iter()
                    .filter(|v| v.ours && v.name != name)
                    .cloned()
                    .collect();
                (current, others)
            }
            DeploymentAction::Resume { current } => {
                od.set_lifecycle(client.clone(), current, LifecycleState::Active)
                    .await?;
                let current = views.iter().find(|v| &v.name == current);
                let others = views
                    .iter()
                    .filter(|v| v.ours && Some(&v.name) != current.map(|c| &c.name))
                    .cloned()
                    .collect();
                (current, others)
            }
            DeploymentAction::Settle {
                current,
                archive,
                delete,
            } => {
                for name in archive {
                    od.set_lifecycle(client.clone(), name, LifecycleState::Archived)
                        .await?;
                }
                for name in delete {
                    od.delete_set(client.clone(), name).await?;
                }
                let current = views.iter().find(|v| &v.name == current);
                let others = views
                    .iter()
                    .filter(|v| {
                        v.ours
                            && Some(&v.name) != current.map(|c| &c.name)
                            && !delete.contains(&v.name)
                    })
                    .map(|v| {
                        let mut v = v.clone();
                        if archive.contains(&v.name) {
                            v.lifecycle = LifecycleState::Archived;
                        }
                        v
                    })
                    .collect();
                (current, others)
            }
        };
        let (conditions, phase) = deployment_conditions(
            &od.status.conditions,
            od.generation(),
            od.spec.paused,
            current,
            &others,
            Timestamp::now(),
        );
        let mut controlled: Vec<&RevisionView> = current.into_iter().chain(&others).collect();
        controlled.sort_by_key(|v| v.revision);
        let controller_of = controlled
            .into_iter()
            .map(|v| ControlledObjectReference {
                kind: od.sets.kind().to_owned(),
                group: pko_proto::GROUP.to_owned(),
                name: v.name.clone(),
                namespace: if od.sets.is_namespaced() {
                    od.namespace().to_owned()
                } else {
                    String::new()
                },
            })
            .collect();
        return Ok(ObjectDeploymentStatus {
            conditions,
            phase: Some(phase.to_owned()),
            collision_count: od.status.collision_count,
            template_hash: Some(hash),
            revision: current.map(|c| c.revision).or(od.status.revision),
            controller_of,
        });
    }
    warn!(
        deployment = od.name(),
        "template hash keeps colliding; will retry on the next event"
    );
    Ok(od.status)
}

/// The ObjectDeployment controller keeps no state between reconciles: the ObjectSets are listed each time.
pub struct ObjectDeploymentController;

pub type ObjectDeploymentActor = ObjectActor<ObjectDeploymentController>;

impl Reconcile for ObjectDeploymentController {
    type Object = DeploymentObject;
    type Reported = Option<i64>;
    const CONTROLLER: &'static str = "object_deployment";
    const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

    fn new(_: &ManagerContext) -> Self {
        Self
    }

    /// Metadata only: the taps following this kind read nothing else of a deleted object.
    fn tombstone(object: &DeploymentObject) -> DeploymentObject {
        DeploymentObject {
            sets: object.sets,
            meta: tombstone_meta(&object.meta),
            spec: Default::default(),
            status: Default::default(),
        }
    }

    fn key(od: &DeploymentObject) -> ObjectRef {
        ObjectRef::of(od.kind(), od)
    }

    fn change(previous: Option<&DeploymentObject>, od: &DeploymentObject) -> Change {
        match previous {
            // Our own status writes come back through the watch; they need no reconcile.
            Some(known) if known.generation() == od.generation() && known.status == od.status => {
                Change::Echo
            }
            _ => Change::Changed,
        }
    }

    fn report(
        previous: Option<&Option<i64>>,
        od: &DeploymentObject,
        _: &ManagerMetrics,
    ) -> Report<Option<i64>> {
        Report {
            remember: od.status.revision,
            notice: previous.map(|previous| Notice {
                reference: event_reference(od.kind(), &od.meta),
                events: deployment_transitions(*previous, od.status.revision),
            }),
        }
    }

    fn reconcile(
        actor: &mut ObjectDeploymentActor,
        od: DeploymentObject,
        _: &mut Context<ObjectDeploymentActor>,
    ) -> Work<Self> {
        let context = actor.context.clone();
        let run = async move {
            let status = reconcile_deployment(context.clone(), od.clone()).await?;
            if status != od.status {
                od.write_status(context.client.clone(), &status).await?;
            }
            Ok::<_, kube::Error>(status)
        };
        work(
            run,
            |result, actor: &mut ObjectDeploymentActor, _| match result {
                Ok(status) => {
                    if let Some(od) = actor.object.as_mut() {
                        od.status = status;
                    }
                    Outcome::Done
                }
                Err(e) => Outcome::Retry(e.to_string()),
            },
        )
    }
}

impl Handler<RevisionChanged> for ObjectDeploymentActor {
    type Result = ();
    fn handle(&mut self, _: RevisionChanged, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::core::object_set::ObjectSet;

    fn set(finalizers: &[&str], available: &str, transition_message: &str) -> SetObject {
        let set: ObjectSet = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
            "metadata": {"name": "od-abc", "namespace": "n", "generation": 1,
                "finalizers": finalizers,
                "ownerReferences": [{"apiVersion": "package-operator.run/v1alpha1",
                    "kind": "ObjectDeployment", "name": "od", "uid": "od-uid", "controller": true}]},
            "spec": {"lifecycleState": "Active", "phases": [{"name": "p", "objects": []}]},
            "status": {"revision": 1, "conditions": [
                {"type": "Available", "status": available, "reason": "R", "message": "m",
                 "observedGeneration": 1, "lastTransitionTime": "2026-11-25T00:00:00Z"},
                {"type": "InTransition", "status": "True", "reason": "R", "message": transition_message,
                 "observedGeneration": 1, "lastTransitionTime": "2026-11-25T00:00:00Z"}]}
        }))
        .unwrap();
        set.into()
    }

    #[test]
    fn a_set_event_wakes_its_deployment_only_when_the_deployment_reads_a_change() {
        let before = RevisionDigest::of(&set(&[], "True", "one"));
        assert_eq!(
            before,
            RevisionDigest::of(&set(&["package-operator.run/teardown"], "True", "two")),
            "a finalizer and a condition the deployment does not read change nothing for it"
        );
        assert_ne!(before, RevisionDigest::of(&set(&[], "False", "one")));
        let mut archived = set(&[], "True", "one");
        archived.spec.lifecycle_state = LifecycleState::Archived;
        assert_ne!(before, RevisionDigest::of(&archived));
        let mut respecified = set(&[], "True", "one");
        respecified.meta.generation = Some(2);
        assert_ne!(before, RevisionDigest::of(&respecified));
    }
}
