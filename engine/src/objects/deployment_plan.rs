//! The ObjectDeployment rules: which ObjectSet is the current revision, when to create one, when the hash
//! collides, which old revisions to archive and delete, and the deployment's conditions. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::common::{LifecycleState, ObjectSetTemplateSpec};

use crate::conditions::{
    is_mapped, is_true_for, mirror_conditions, set_condition, ConditionUpdate,
};
use crate::objects::object_ref::ObjectKey;
use pko_package::canonical_hash::value_digest;
use std::collections::BTreeSet;

/// Objects by group, kind, namespace and name (the version does not matter); a template may leave the
/// namespace empty for the set's own.
pub type ObjectNames = BTreeSet<(String, String, String, String)>;

/// What the plan reads of a template: a digest standing for all of it (a set holding the revision's name
/// with other content is a collision) and the objects it names (which revisions share objects).
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionContent {
    digest: [u8; 32],
    objects: ObjectNames,
}

impl RevisionContent {
    pub fn of(template: &ObjectSetTemplateSpec) -> Self {
        let value = serde_json::to_value(template).unwrap_or(serde_json::Value::Null);
        Self {
            digest: value_digest(&value),
            objects: object_keys(template),
        }
    }
}

/// One existing ObjectSet as the deployment sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionView {
    pub name: String,
    /// Controlled by this deployment.
    pub ours: bool,
    pub revision: i64,
    pub content: RevisionContent,
    pub lifecycle: LifecycleState,
    pub available: bool,
    /// Why it is not available, when it says so for its current generation.
    pub unavailable: Option<String>,
    pub succeeded: bool,
    pub archived: bool,
    /// Conditions with a `domain/Type` name, to copy upward.
    pub mapped: Vec<Condition>,
    /// It has reported a status for its current generation.
    pub reported: bool,
    /// The objects its status says it controls.
    pub controls: ObjectNames,
}

impl RevisionView {
    /// Whether this revision reported control of an object `older`'s template names: `older` handed
    /// that object over, even while its own report of the handover is still on its way (two sets'
    /// reports reach the deployment one after the other, in either order).
    pub fn took_over_from(&self, older: &RevisionView) -> bool {
        let names = &older.content.objects;
        self.reported
            && self.controls.iter().any(|(group, kind, namespace, name)| {
                names.contains(&(group.clone(), kind.clone(), namespace.clone(), name.clone()))
                    || names.contains(&(group.clone(), kind.clone(), String::new(), name.clone()))
            })
    }
}

/// What the deployment must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum DeploymentAction {
    /// The name for the current template is taken by a foreign or different set: bump collisionCount.
    BumpCollisionCount,
    /// Create the set for the current template.
    Create {
        name: String,
        revision: i64,
        previous: Vec<String>,
    },
    /// The current revision exists; archive and prune the others.
    Settle {
        current: String,
        archive: Vec<String>,
        delete: Vec<String>,
    },
    /// The current revision was paused with the deployment; make it Active again.
    Resume { current: String },
    /// The deployment is paused: no new revision, no archival; these live revisions get paused.
    Hold { pause: Vec<String> },
}

/// Name of the ObjectSet for a template hash.
pub fn revision_name(deployment: &str, hash: &str) -> String {
    format!("{deployment}-{hash}")
}

/// Progressing reason while the latest revision reports, for its current generation, why it is not
/// available (failing probes, a collision, a preflight error).
pub const LATEST_REVISION_UNAVAILABLE: &str = "LatestRevisionUnavailable";

/// Decides the next action from the template's content, its hash-derived name and the existing sets.
pub fn plan_deployment(
    template: &RevisionContent,
    wanted_name: &str,
    revisions: &[RevisionView],
    history_limit: i32,
    paused: bool,
) -> DeploymentAction {
    let ours: Vec<&RevisionView> = revisions.iter().filter(|r| r.ours).collect();
    if paused {
        let pause = ours
            .iter()
            .filter(|r| r.lifecycle == LifecycleState::Active)
            .map(|r| r.name.clone())
            .collect();
        return DeploymentAction::Hold { pause };
    }
    let Some(current) = revisions.iter().find(|r| r.name == wanted_name) else {
        let revision = ours.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
        let mut previous: Vec<&RevisionView> =
            ours.iter().copied().filter(|r| !r.archived).collect();
        previous.sort_by_key(|r| r.revision);
        return DeploymentAction::Create {
            name: wanted_name.to_owned(),
            revision,
            previous: previous.into_iter().map(|r| r.name.clone()).collect(),
        };
    };
    // Going back to an earlier template (a rollback) never makes its old set the latest again when that
    // set has handed objects over: archived, or with a newer revision still active. A set adopts only
    // from the revisions before it, so the old one could not take its objects back from the newer one,
    // and the newer one is not archived until the latest is available. The template gets a new revision
    // under a new name (upstream's collision count), whose previous revisions are every active one.
    let superseded = ours
        .iter()
        .any(|r| r.revision > current.revision && r.lifecycle != LifecycleState::Archived);
    if !current.ours
        || current.content != *template
        || current.lifecycle == LifecycleState::Archived
        || superseded
    {
        return DeploymentAction::BumpCollisionCount;
    }
    if current.lifecycle == LifecycleState::Paused {
        // Unpaused again: resume the current revision before anything else.
        return DeploymentAction::Resume {
            current: current.name.clone(),
        };
    }
    // Once the latest revision is available every older one goes. Until then an older revision that is
    // not available either and shares no object with the latest serves nothing: it goes too, as upstream
    // archives such intermediate revisions; the last available one keeps serving.
    let latest_objects = &current.content.objects;
    let archive: Vec<String> = ours
        .iter()
        .filter(|r| r.name != current.name && r.lifecycle != LifecycleState::Archived)
        .filter(|r| {
            current.available || (!r.available && r.content.objects.is_disjoint(latest_objects))
        })
        .map(|r| r.name.clone())
        .collect();
    // History counts every set archived by its spec, including those archived now: one past the limit
    // is deleted in the same step (its teardown continues under the deletion), so the deployment never
    // reports itself settled while history it will delete is still there.
    let mut archived: Vec<&RevisionView> = ours
        .iter()
        .copied()
        .filter(|r| {
            r.name != current.name
                && (r.lifecycle == LifecycleState::Archived || archive.contains(&r.name))
        })
        .collect();
    archived.sort_by_key(|r| std::cmp::Reverse(r.revision));
    let keep = usize::try_from(history_limit.max(0)).unwrap_or(0);
    let delete = archived.iter().skip(keep).map(|r| r.name.clone()).collect();
    DeploymentAction::Settle {
        current: current.name.clone(),
        archive,
        delete,
    }
}

fn object_keys(template: &ObjectSetTemplateSpec) -> ObjectNames {
    template
        .phases
        .iter()
        .flat_map(|p| &p.objects)
        .filter_map(|o| ObjectKey::of(&o.object))
        .map(|k| (k.group, k.kind, k.namespace, k.name))
        .collect()
}

/// The deployment's conditions and summary phase.
pub fn deployment_conditions(
    previous: &[Condition],
    generation: i64,
    paused: bool,
    current: Option<&RevisionView>,
    others: &[RevisionView],
    now: Timestamp,
) -> (Vec<Condition>, &'static str) {
    let mut conditions = previous.to_vec();
    let set = |c: &mut Vec<Condition>, u| set_condition(c, u, generation, now);
    if paused {
        set(
            &mut conditions,
            ConditionUpdate::new("Paused", true, "Paused", "ObjectDeployment is paused."),
        );
    } else {
        conditions.retain(|c| c.type_ != "Paused");
    }
    // Available on the strength of the latest revision, or of an older one that still says so for its
    // current generation. An older revision that handed objects over says HandedOver, not Available, so
    // it cannot vouch for objects that are now the latest revision's; nor can one whose report of the
    // handover has not arrived yet while the latest revision's report of taking them over has.
    let previous_live = others
        .iter()
        .filter(|r| r.available && r.lifecycle != LifecycleState::Archived)
        .filter(|r| !current.is_some_and(|c| c.took_over_from(r)))
        .max_by_key(|r| r.revision);
    let latest_unavailable = current
        .and_then(|c| c.unavailable.as_deref())
        .map(|m| format!("Latest Revision is Unavailable: {m}"));
    let available = if current.is_some_and(|c| c.available) {
        ConditionUpdate::new(
            "Available",
            true,
            "Available",
            "Latest Revision is Available.",
        )
    } else if let Some(previous) = previous_live {
        ConditionUpdate::new(
            "Available",
            true,
            "Available",
            format!("Previous Revision '{}' is still Available.", previous.name),
        )
    } else {
        let message = match &latest_unavailable {
            Some(why) => format!("No ObjectSet is available. {why}"),
            None => "No ObjectSet is available.".to_owned(),
        };
        ConditionUpdate::new("Available", false, "ObjectSetUnready", message)
    };
    set(&mut conditions, available);
    let settled = current.is_some_and(|c| c.succeeded)
        && others
            .iter()
            .all(|r| r.lifecycle == LifecycleState::Archived);
    let progressing = if settled {
        ConditionUpdate::new("Progressing", false, "Idle", "Update concluded.")
    } else if current.is_some_and(|c| c.available) {
        ConditionUpdate::new(
            "Progressing",
            true,
            "LatestRevisionPendingSuccess",
            "Latest revision is available, waiting for success and archival of older revisions.",
        )
    } else if let Some(why) = latest_unavailable {
        // The latest revision was reconciled and reports why it is not available: a failure to show,
        // not a revision still on its way.
        ConditionUpdate::new("Progressing", true, LATEST_REVISION_UNAVAILABLE, why)
    } else if current.is_some() {
        ConditionUpdate::new(
            "Progressing",
            true,
            "Progressing",
            "Latest revision is progressing.",
        )
    } else {
        ConditionUpdate::new(
            "Progressing",
            true,
            "Progressing",
            "Progressing to a new ObjectSet.",
        )
    };
    set(&mut conditions, progressing);
    // Mapped conditions come from the current revision only, and only if fresh there. Those it still
    // reports are updated in place, so their lastTransitionTime moves only with their status.
    let mapped = current.map(|c| c.mapped.as_slice()).unwrap_or_default();
    mirror_conditions(&mut conditions, mapped, is_mapped, generation, now);
    let phase = if paused {
        "Paused"
    } else if is_true_for(&conditions, "Available", generation) {
        "Available"
    } else {
        "NotReady"
    };
    (conditions, phase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::core::common::ObjectSetTemplatePhase;

    fn template(phase: &str) -> ObjectSetTemplateSpec {
        let mut t = ObjectSetTemplateSpec::default();
        t.phases.push(ObjectSetTemplatePhase {
            name: phase.into(),
            ..Default::default()
        });
        t
    }

    fn rev(
        name: &str,
        revision: i64,
        phase: &str,
        available: bool,
        archived: bool,
    ) -> RevisionView {
        RevisionView {
            name: name.into(),
            ours: true,
            revision,
            content: RevisionContent::of(&template(phase)),
            lifecycle: if archived {
                LifecycleState::Archived
            } else {
                LifecycleState::Active
            },
            available,
            unavailable: None,
            succeeded: available,
            archived,
            mapped: vec![],
            reported: true,
            controls: ObjectNames::new(),
        }
    }

    /// `r` with a template of one phase `p` naming a ConfigMap with `metadata`.
    fn naming_configmap(mut r: RevisionView, metadata: serde_json::Value) -> RevisionView {
        let mut t = template("p");
        t.phases[0]
            .objects
            .push(pko_proto::core::common::ObjectSetObject {
                object: serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": metadata}),
                ..Default::default()
            });
        r.content = RevisionContent::of(&t);
        r
    }

    /// Upstream's table over six revisions, each with its own object: r1 available, r2 available, r3
    /// unavailable, r4 unavailable, r5 unavailable, r6 available.
    #[test]
    fn returning_to_an_archived_template_makes_a_new_revision() {
        let mut archived = rev("od-1", 1, "a", true, true);
        archived.lifecycle = LifecycleState::Archived;
        let active = rev("od-2", 2, "b", true, false);
        let action = plan_deployment(
            &archived.content.clone(),
            "od-1",
            &[archived, active],
            5,
            false,
        );
        assert_eq!(action, DeploymentAction::BumpCollisionCount);
    }

    /// Back to revision 1's template while revision 2 (which took revision 1's objects but never became
    /// available) is still active: revision 1 cannot take them back, so the template becomes revision 3,
    /// which may adopt from both.
    #[test]
    fn returning_to_a_template_a_newer_active_revision_superseded_makes_a_new_revision() {
        let first = rev("od-1", 1, "a", false, false);
        let broken = rev("od-2", 2, "b", false, false);
        let revisions = [first.clone(), broken];
        let action = plan_deployment(&first.content, "od-1", &revisions, 5, false);
        assert_eq!(action, DeploymentAction::BumpCollisionCount);
        // With the bumped count the template hashes to a new name: revision 3 after both.
        assert_eq!(
            plan_deployment(&first.content, "od-1b", &revisions, 5, false),
            DeploymentAction::Create {
                name: "od-1b".into(),
                revision: 3,
                previous: vec!["od-1".into(), "od-2".into()]
            }
        );
        // A newer revision that is archived already supersedes nothing: the old set is the latest again.
        let mut archived = rev("od-2", 2, "b", false, true);
        archived.lifecycle = LifecycleState::Archived;
        assert!(matches!(
            plan_deployment(&first.content, "od-1", &[first.clone(), archived], 5, false),
            DeploymentAction::Settle { .. }
        ));
    }

    #[test]
    fn unavailable_intermediate_revisions_sharing_nothing_with_the_latest_are_archived() {
        let own = |name: &str, revision: i64, available: bool, archived: bool| {
            naming_configmap(
                rev(name, revision, "p", available, archived),
                serde_json::json!({"name": format!("cm-{revision}")}),
            )
        };
        let archive_of = |revisions: &[RevisionView]| {
            let latest = revisions.last().unwrap();
            match plan_deployment(&latest.content, &latest.name, revisions, 10, false) {
                DeploymentAction::Settle { archive, .. } => archive,
                other => panic!("{other:?}"),
            }
        };
        // After r2 (available): r1.
        assert_eq!(
            archive_of(&[own("r1", 1, true, false), own("r2", 2, true, false)]),
            ["r1"]
        );
        // After r4 (unavailable): r3, not r2 which still serves.
        let after_r4 = [
            own("r1", 1, true, true),
            own("r2", 2, true, false),
            own("r3", 3, false, false),
            own("r4", 4, false, false),
        ];
        assert_eq!(archive_of(&after_r4), ["r3"]);
        // After r6 (available): everything older.
        let after_r6 = [
            own("r1", 1, true, true),
            own("r2", 2, true, false),
            own("r3", 3, false, true),
            own("r4", 4, false, false),
            own("r5", 5, false, false),
            own("r6", 6, true, false),
        ];
        assert_eq!(archive_of(&after_r6), ["r2", "r4", "r5"]);
        // An unavailable revision that shares an object with the latest keeps it until the latest has it.
        let mut shares = own("r3", 3, false, false);
        shares.content = own("r4", 4, false, false).content;
        assert!(archive_of(&[
            own("r2", 2, true, false),
            shares,
            own("r4", 4, false, false)
        ])
        .is_empty());
    }

    #[test]
    fn first_revision_is_created() {
        assert_eq!(
            plan_deployment(&RevisionContent::of(&template("a")), "od-x", &[], 10, false),
            DeploymentAction::Create {
                name: "od-x".into(),
                revision: 1,
                previous: vec![]
            }
        );
    }

    #[test]
    fn new_template_creates_next_revision_with_previous() {
        let revs = [
            rev("od-1", 1, "a", true, true),
            rev("od-2", 2, "b", true, false),
        ];
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("c")),
                "od-3",
                &revs,
                10,
                false
            ),
            DeploymentAction::Create {
                name: "od-3".into(),
                revision: 3,
                previous: vec!["od-2".into()]
            }
        );
    }

    #[test]
    fn foreign_or_different_set_with_our_name_is_a_collision() {
        let mut foreign = rev("od-x", 1, "a", true, false);
        foreign.ours = false;
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("a")),
                "od-x",
                &[foreign],
                10,
                false
            ),
            DeploymentAction::BumpCollisionCount
        );
        let different = rev("od-x", 1, "zzz", true, false);
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("a")),
                "od-x",
                &[different],
                10,
                false
            ),
            DeploymentAction::BumpCollisionCount
        );
    }

    #[test]
    fn archives_once_current_is_available_and_prunes_history() {
        let mut revs: Vec<RevisionView> = (1..=5)
            .map(|i| rev(&format!("od-{i}"), i, &i.to_string(), true, i < 4))
            .collect();
        revs[4].available = false;
        // Current (5) not available: nothing archived yet; archived beyond the limit pruned oldest first.
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("5")),
                "od-5",
                &revs,
                2,
                false
            ),
            DeploymentAction::Settle {
                current: "od-5".into(),
                archive: vec![],
                delete: vec!["od-1".into()]
            }
        );
        revs[4].available = true;
        // od-4 archived now counts in the history at once: od-4 and od-3 are kept, od-2 goes with od-1.
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("5")),
                "od-5",
                &revs,
                2,
                false
            ),
            DeploymentAction::Settle {
                current: "od-5".into(),
                archive: vec!["od-4".into()],
                delete: vec!["od-2".into(), "od-1".into()]
            }
        );
    }

    #[test]
    fn pause_holds_everything_and_unpause_resumes() {
        let revs = [
            rev("od-1", 1, "a", true, true),
            rev("od-2", 2, "b", true, false),
        ];
        // Paused with a new template: no new revision, the live one is paused.
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("c")),
                "od-3",
                &revs,
                10,
                true
            ),
            DeploymentAction::Hold {
                pause: vec!["od-2".into()]
            }
        );
        let mut paused = revs.clone();
        paused[1].lifecycle = LifecycleState::Paused;
        assert_eq!(
            plan_deployment(
                &RevisionContent::of(&template("b")),
                "od-2",
                &paused,
                10,
                false
            ),
            DeploymentAction::Resume {
                current: "od-2".into()
            }
        );
        let (c, phase) = deployment_conditions(
            &[],
            1,
            true,
            Some(&revs[1]),
            &[],
            Timestamp::from_second(1).unwrap(),
        );
        assert_eq!(phase, "Paused");
        assert!(c.iter().any(|c| c.type_ == "Paused" && c.status == "True"));
    }

    #[test]
    fn conditions_follow_revisions() {
        let now = Timestamp::from_second(10).unwrap();
        let (c, phase) = deployment_conditions(&[], 1, false, None, &[], now);
        assert_eq!(phase, "NotReady");
        assert!(c
            .iter()
            .any(|c| c.type_ == "Available" && c.reason == "ObjectSetUnready"));
        let current = rev("od-2", 2, "b", true, false);
        let old = rev("od-1", 1, "a", true, true);
        let (c, phase) = deployment_conditions(&c, 1, false, Some(&current), &[old], now);
        assert_eq!(phase, "Available");
        assert!(c
            .iter()
            .any(|c| c.type_ == "Progressing" && c.status == "False" && c.reason == "Idle"));
    }

    #[test]
    fn availability_rests_on_a_revision_that_says_so_now() {
        let now = Timestamp::from_second(10).unwrap();
        let find = |c: &[Condition], t: &str| {
            let c = c.iter().find(|c| c.type_ == t).unwrap();
            (c.status.clone(), c.reason.clone(), c.message.clone())
        };
        let mut latest = rev("od-2", 2, "b", false, false);
        latest.succeeded = false;
        let previous = rev("od-1", 1, "a", true, false);
        // The latest revision is on its way; the previous one still passes its probes.
        let (c, _) = deployment_conditions(
            &[],
            1,
            false,
            Some(&latest),
            std::slice::from_ref(&previous),
            now,
        );
        assert_eq!(
            find(&c, "Available"),
            (
                "True".into(),
                "Available".into(),
                "Previous Revision 'od-1' is still Available.".into()
            )
        );
        assert_eq!(find(&c, "Progressing").1, "Progressing");
        // The latest revision reports a failure, and the previous one handed its objects over.
        latest.unavailable = Some("Phase \"deploy\" failed: Widget ns/w: condition".into());
        let mut handed_over = previous;
        handed_over.available = false;
        handed_over.unavailable = Some("Phase \"deploy\" failed: handed over".into());
        let (c, phase) = deployment_conditions(&c, 1, false, Some(&latest), &[handed_over], now);
        assert_eq!(phase, "NotReady");
        let (status, reason, message) = find(&c, "Available");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "ObjectSetUnready")
        );
        assert!(
            message.ends_with(
                "Latest Revision is Unavailable: Phase \"deploy\" failed: Widget ns/w: condition"
            ),
            "{message}"
        );
        assert_eq!(
            find(&c, "Progressing"),
            (
                "True".into(),
                LATEST_REVISION_UNAVAILABLE.into(),
                "Latest Revision is Unavailable: Phase \"deploy\" failed: Widget ns/w: condition"
                    .into()
            )
        );
        // An archived revision never counts, whatever it said before.
        let mut archived = rev("od-1", 1, "a", true, true);
        archived.lifecycle = LifecycleState::Archived;
        let (c, _) = deployment_conditions(&c, 1, false, Some(&latest), &[archived], now);
        assert_eq!(find(&c, "Available").0, "False");
    }

    #[test]
    fn a_previous_revision_cannot_vouch_once_the_latest_reported_taking_its_objects() {
        let now = Timestamp::from_second(10).unwrap();
        let available = |c: &[Condition]| {
            let c = c.iter().find(|c| c.type_ == "Available").unwrap();
            (c.status.clone(), c.reason.clone())
        };
        // Both templates name the ConfigMap `shared` (the previous one without a namespace: the set's).
        let with_shared = |name: &str, revision: i64, namespace: &str| {
            naming_configmap(
                rev(name, revision, "p", false, false),
                serde_json::json!({"name": "shared", "namespace": namespace}),
            )
        };
        let previous = RevisionView {
            available: true,
            succeeded: true,
            ..with_shared("od-1", 1, "")
        };
        let mut latest = with_shared("od-2", 2, "ns");
        latest.reported = false;
        let took = (
            String::new(),
            "ConfigMap".to_owned(),
            "ns".to_owned(),
            "shared".to_owned(),
        );
        latest.controls.insert(took.clone());
        let others = std::slice::from_ref(&previous);
        // Not reported for its generation yet: what it controls is an old report's.
        let (c, _) = deployment_conditions(&[], 1, false, Some(&latest), others, now);
        assert_eq!(available(&c), ("True".into(), "Available".into()));
        // Its report says it controls `shared`; the previous revision's handover report is still on
        // its way, and it cannot vouch any more.
        latest.reported = true;
        assert!(latest.took_over_from(&previous));
        let (c, phase) = deployment_conditions(&c, 1, false, Some(&latest), others, now);
        assert_eq!(available(&c), ("False".into(), "ObjectSetUnready".into()));
        assert_eq!(phase, "NotReady");
        // Controlling only an object the previous template does not name takes nothing from it.
        latest.controls.clear();
        latest.controls.insert((
            String::new(),
            "ConfigMap".to_owned(),
            "ns".to_owned(),
            "other".to_owned(),
        ));
        assert!(!latest.took_over_from(&previous));
        let (c, _) = deployment_conditions(&c, 1, false, Some(&latest), others, now);
        assert_eq!(available(&c), ("True".into(), "Available".into()));
        // Nor does the same name in another namespace.
        let elsewhere = with_shared("od-1", 1, "elsewhere");
        latest.controls.insert(took);
        assert!(!latest.took_over_from(&elsewhere));
    }

    #[test]
    fn mapped_conditions_keep_their_transition_time_while_their_status_holds() {
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let mut current = rev("od-1", 1, "a", true, false);
        current.mapped = vec![Condition {
            type_: "my-org.io/Ready".into(),
            status: "True".into(),
            reason: "Ready".into(),
            message: "ready".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)),
        }];
        let (first, _) = deployment_conditions(&[], 1, false, Some(&current), &[], at(5));
        let (again, _) = deployment_conditions(&first, 1, false, Some(&current), &[], at(9));
        assert_eq!(again, first, "nothing changed, nothing to write");
        current.mapped.clear();
        let (gone, _) = deployment_conditions(&again, 1, false, Some(&current), &[], at(12));
        assert!(!gone.iter().any(|c| c.type_.contains('/')));
    }
}
