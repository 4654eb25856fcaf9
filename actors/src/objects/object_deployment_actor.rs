//! The ObjectDeployment actor: one per ObjectDeployment or ClusterObjectDeployment. Each reconcile reads
//! the deployment's ObjectSets (from the watch-fed index, or a list when the index lags), lets the
//! deployment plan decide (create a revision, bump the collision count, archive and prune old revisions),
//! applies that, and writes status only when it changes. Events of its ObjectSets wake it directly.

use std::time::{Duration, Instant};

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::common::{ControlledObjectReference, LifecycleState};
use pko_proto::core::object_deployment::ObjectDeploymentStatus;
use tracing::warn;

use crate::engine::objects::deployment_plan::{
    deployment_conditions, plan_deployment, revision_name, DeploymentAction, RevisionContent,
    RevisionView,
};
use crate::engine::objects::template_hash::template_hash;
use crate::engine::status_hold::StatusHold;
use crate::engine::transition_events::deployment_transitions;
use crate::manager::context::ManagerContext;
use crate::objects::deployment_object::DeploymentObject;
use crate::objects::object_meta::{event_reference, tombstone_meta};
use crate::objects::revision_index::revision_view;
use crate::runtime::meta_view::MetaView;
use crate::runtime::object_actor::{work, Action, Notice, ObjectActor, Reconcile, Report, Work};

/// Collision-count bumps within one reconcile before giving up until the next event.
const MAX_COLLISIONS_PER_RUN: usize = 5;

/// One of the deployment's ObjectSets changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RevisionChanged;

/// The deployment's sets, and whether they came from the index: from the index when it holds every set
/// the status names and the one this actor `created` last (which the status may not name yet), unless
/// `list`; otherwise listed (sets not yet seen by this replica's watch). A new revision's set is not
/// required of the index: it does not exist yet on most updates, and a create that finds it made
/// already (the watch lagging) lists before anything is decided on it.
async fn revisions(
    context: &ManagerContext,
    od: &DeploymentObject,
    created: Option<&str>,
    list: bool,
) -> Result<(Vec<RevisionView>, bool), kube::Error> {
    let known: Vec<&str> = od
        .status
        .controller_of
        .iter()
        .map(|set| set.name.as_str())
        .chain(created)
        .collect();
    let indexed = (!list)
        .then(|| {
            context
                .revisions
                .revisions(od.sets, od.namespace(), od.name(), od.uid(), &known)
        })
        .flatten();
    if let Some(views) = indexed {
        context.metrics.deployment_sets_read(true);
        return Ok((views, true));
    }
    context.metrics.deployment_sets_read(false);
    let sets = od.list_sets(context.runtime.client.clone()).await?;
    let views = sets
        .iter()
        .map(|set| revision_view(set, RevisionContent::of(&set.spec.template), Some(od.uid())))
        .collect();
    Ok((views, false))
}

/// The revisions this deployment controls other than `current`.
fn ours_besides(views: &[RevisionView], current: &str) -> Vec<RevisionView> {
    views
        .iter()
        .filter(|v| v.ours && v.name != current)
        .cloned()
        .collect()
}

/// What one reconcile found: the status to publish, and the name of the current revision when it has
/// not reported a status for its generation yet (one this deployment just created).
struct Reconciled {
    status: ObjectDeploymentStatus,
    unreported: Option<String>,
    /// The set this reconcile created.
    created: Option<String>,
}

/// What one reconcile did, taken back into the actor.
struct DeploymentRan {
    /// The status written, or found stored already; `None` while the write is held back.
    stored: Option<ObjectDeploymentStatus>,
    hold: StatusHold,
    /// How long the status write is held back for the new revision's first report.
    held_for: Option<Duration>,
    /// The set this reconcile created.
    created: Option<String>,
}

/// A reconcile that failed, with the set it created before failing (the index must show that set
/// before the deployment decides from the index again).
struct DeploymentFailed {
    error: kube::Error,
    created: Option<String>,
}

/// One reconcile; `created` is the set this actor created last.
async fn reconcile_deployment(
    context: ManagerContext,
    mut od: DeploymentObject,
    created: Option<String>,
) -> Result<Reconciled, kube::Error> {
    let client = context.runtime.client.clone();
    let wanted = RevisionContent::of(&od.spec.template.spec);
    let mut list = false;
    let mut made = None;
    for _ in 0..MAX_COLLISIONS_PER_RUN {
        let count = od.status.collision_count.unwrap_or(0);
        let hash = template_hash(&od.spec.template, count);
        let name = revision_name(od.name(), &hash);
        let (views, indexed) = revisions(&context, &od, created.as_deref(), list).await?;
        let created_view: Option<RevisionView>;
        let action = plan_deployment(
            &wanted,
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
                let created = match od
                    .create_set(
                        client.clone(),
                        name,
                        &hash,
                        *revision,
                        previous,
                        context.runtime.shard.as_ref().map(|s| &*s.member),
                    )
                    .await
                {
                    Ok(created) => created,
                    // The index may not show a set already made (by this replica a moment ago, or by
                    // another): decide again on a list.
                    Err(kube::Error::Api(s)) if s.code == 409 && indexed => {
                        list = true;
                        continue;
                    }
                    // A set we could not list (not labelled as ours) holds the name: that is a collision.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        od.status.collision_count = Some(count + 1);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                // The status speaks of the revision just created, as the create answered it: its first
                // status then rewrites nothing of the deployment's (nor of a Package mirroring it).
                let created = revision_view(&created, wanted.clone(), Some(od.uid()));
                made = Some(created.name.clone());
                let others = views.iter().filter(|v| v.ours).cloned().collect();
                created_view = Some(created);
                (created_view.as_ref(), others)
            }
            DeploymentAction::Hold { pause } => {
                for name in pause {
                    od.set_lifecycle(client.clone(), name, LifecycleState::Paused)
                        .await?;
                }
                let current = views.iter().find(|v| v.name == name);
                (current, ours_besides(&views, &name))
            }
            DeploymentAction::Resume { current } => {
                od.set_lifecycle(client.clone(), current, LifecycleState::Active)
                    .await?;
                (
                    views.iter().find(|v| &v.name == current),
                    ours_besides(&views, current),
                )
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
                    // Gone from the metrics before the status that reports the deployment settled.
                    if let Some(uid) = od.delete_set(client.clone(), name).await? {
                        context
                            .metrics
                            .upstream
                            .retire_object_set(name, od.namespace(), &uid);
                    }
                }
                let current = views.iter().find(|v| &v.name == current);
                let others = settled_others(&views, current, archive, delete);
                (current, others)
            }
        };
        return Ok(Reconciled {
            created: made,
            ..deployment_status(&od, hash, current, &others)
        });
    }
    warn!(
        deployment = od.name(),
        "template hash keeps colliding; will retry on the next event"
    );
    Ok(Reconciled {
        status: od.status,
        unreported: None,
        created: made,
    })
}

/// The revisions besides `current` this deployment controls once `archive` are archived and `delete`
/// deleted.
fn settled_others(
    views: &[RevisionView],
    current: Option<&RevisionView>,
    archive: &[String],
    delete: &[String],
) -> Vec<RevisionView> {
    views
        .iter()
        .filter(|v| {
            v.ours && Some(&v.name) != current.map(|c| &c.name) && !delete.contains(&v.name)
        })
        .map(|v| {
            let mut v = v.clone();
            if archive.contains(&v.name) {
                v.lifecycle = LifecycleState::Archived;
            }
            v
        })
        .collect()
}

/// The status that reports `current` (the revision the template names, if it exists) and the other
/// revisions this deployment controls, and the name of `current` while it has not reported yet.
fn deployment_status(
    od: &DeploymentObject,
    hash: String,
    current: Option<&RevisionView>,
    others: &[RevisionView],
) -> Reconciled {
    let (conditions, phase) = deployment_conditions(
        &od.status.conditions,
        od.generation(),
        od.spec.paused,
        current,
        others,
        Timestamp::now(),
    );
    let mut controlled: Vec<&RevisionView> = current.into_iter().chain(others).collect();
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
    let unreported = current
        .filter(|c| c.ours && !c.reported)
        .map(|c| c.name.clone());
    let status = ObjectDeploymentStatus {
        conditions,
        phase: Some(phase.to_owned()),
        collision_count: od.status.collision_count,
        template_hash: Some(hash),
        revision: current.map(|c| c.revision).or(od.status.revision),
        controller_of,
    };
    Reconciled {
        status,
        unreported,
        created: None,
    }
}

/// The ObjectSets come from the manager's [`RevisionIndex`](crate::objects::revision_index::RevisionIndex)
/// or a list; the controller keeps only its status hold between reconciles.
#[derive(Default)]
pub struct ObjectDeploymentController {
    /// A revision just created has not reported yet: the status waits for it, briefly, instead of being
    /// written from the previous revision's report and again a moment later.
    hold: StatusHold,
    /// The set this actor created last, until a status naming it is written: the index must show it
    /// before the deployment decides from the index (else a lagging watch could make a second revision
    /// under the same number).
    created: Option<String>,
}

pub type ObjectDeploymentActor = ObjectActor<ObjectDeploymentController>;

impl Reconcile for ObjectDeploymentController {
    type Shared = ManagerContext;
    type Object = DeploymentObject;
    type Reported = Option<i64>;
    const CONTROLLER: &'static str = "object_deployment";
    /// Metadata only: the taps following this kind read nothing else of a deleted object.
    fn tombstone(object: &DeploymentObject) -> DeploymentObject {
        DeploymentObject {
            sets: object.sets,
            meta: tombstone_meta(&object.meta),
            spec: Default::default(),
            status: Default::default(),
        }
    }

    fn report(
        previous: Option<&Option<i64>>,
        od: &DeploymentObject,
        _: &ManagerContext,
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
        // Reconciles of one actor never overlap: the hold goes with this one and comes back with it.
        let hold = actor.state.hold.clone();
        let created = actor.state.created.clone();
        let run = async move {
            let failed = |error, created| DeploymentFailed { error, created };
            let Reconciled {
                status,
                unreported,
                created,
            } = reconcile_deployment(context.clone(), od.clone(), created)
                .await
                .map_err(|e| failed(e, None))?;
            let mut ran = DeploymentRan {
                stored: None,
                hold,
                held_for: None,
                created,
            };
            if status != od.status {
                ran.held_for = ran.hold.hold(unreported.as_deref(), Instant::now());
                if ran.held_for.is_some() {
                    return Ok(ran);
                }
                // A failed write still hands back the set just created.
                if let Err(e) = od
                    .write_status(context.runtime.client.clone(), &status)
                    .await
                {
                    return Err(failed(e, ran.created));
                }
            }
            ran.stored = Some(status);
            Ok(ran)
        };
        work(
            run,
            |result, actor: &mut ObjectDeploymentActor, _| match result {
                Ok(ran) => {
                    actor.state.hold = ran.hold;
                    // Remembered until a stored status names it.
                    let named = |set: &String| {
                        ran.stored
                            .as_ref()
                            .is_some_and(|s| s.controller_of.iter().any(|c| &c.name == set))
                    };
                    actor.state.created = ran
                        .created
                        .or(actor.state.created.take())
                        .filter(|set| !named(set));
                    if let (Some(status), Some(od)) = (ran.stored, actor.object.as_mut()) {
                        od.status = status;
                    }
                    // The revision's first report wakes the deployment sooner.
                    Ok(ran
                        .held_for
                        .map_or(Action::AwaitChange, Action::RequeueAfter))
                }
                Err(DeploymentFailed { error, created }) => {
                    actor.state.created = created.or(actor.state.created.take());
                    Err(error.into())
                }
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
