//! What the preflight of a release means to its rollout (pko extension, issue 43): when a preflight is
//! due (a template or its render inputs changed while a Package is still to be updated, or one was asked
//! for), whether updates hold for it (`rolloutPolicy.preflight.onRefusal: Hold`, the default: while the
//! first preflight of the template runs, and while a refusal it found is not accepted for that very
//! digest), and the `Preflight` condition that says so. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use pko_package::canonical_hash::{hex, value_digest};
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, RolloutApproval};
use pko_proto::core::package::PackageTemplateSpec;
use pko_proto::core::rollout_preflight::{HostedClusterPackagePreflightStatus, PreflightOnRefusal};
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::{
    ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION, ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION,
};
use serde_json::json;

use crate::conditions::ConditionUpdate;
use crate::fleet::promotion_gate::package_template_hash;
use crate::rollout::hosted_cluster_package::OwnedPackage;

pub const PREFLIGHT: &str = "Preflight";

/// The hash of what a release's render depends on besides its template: each target namespace with its
/// HostedCluster's name, labels, annotations and node selector (what `.environment.hyperShift` shows).
/// A HostedCluster joining or leaving, or one whose data changed, makes a new one.
pub fn preflight_inputs_hash(template_hash: &str, clusters: &[Arc<HostedCluster>]) -> String {
    let targets: BTreeMap<String, serde_json::Value> = clusters
        .iter()
        .filter_map(|hc| {
            let namespace = hc.hosted_control_plane_namespace()?;
            let data = json!([
                hc.metadata.name,
                hc.metadata.labels,
                hc.metadata.annotations,
                hc.spec.as_ref().and_then(|s| s.get("nodeSelector")),
            ]);
            Some((namespace, data))
        })
        .collect();
    let digest = value_digest(&json!({"template": template_hash, "targets": targets}));
    hex(&digest[..8])
}

/// Whether a Package the HostedClusterPackage owns is still to be updated to `template`: only then is
/// there a change to preflight (creations change nothing that exists).
pub fn anything_to_update(
    template: &PackageTemplateSpec,
    packages: &BTreeMap<String, Arc<OwnedPackage>>,
) -> bool {
    packages.values().any(|p| p.spec != template.spec)
}

/// Whether a decision hashes what each target's render depends on (`preflight_inputs_hash`): only while
/// a Package is still to be updated or a preflight is asked for.
pub fn hashes_targets(
    hcpkg: &HostedClusterPackage,
    packages: &BTreeMap<String, Arc<OwnedPackage>>,
) -> bool {
    let requested = hcpkg
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION));
    requested || anything_to_update(&hcpkg.spec.template, packages)
}

/// What the preflight is asked against in one decision.
#[derive(Debug, Clone, Copy)]
pub struct PreflightFacts<'a> {
    pub on_refusal: PreflightOnRefusal,
    pub template_hash: &'a str,
    pub inputs_hash: &'a str,
    /// The newest finished preflight, of any template.
    pub last: Option<&'a HostedClusterPackagePreflightStatus>,
    /// The request annotation's value, if set.
    pub requested: Option<&'a str>,
    /// The acceptance annotation, if set.
    pub accepted: Option<&'a RolloutApproval>,
    pub anything_to_update: bool,
    /// Rolling back to the last good template: the preflight holds nothing then.
    pub rolling_back: bool,
}

/// What the preflight means for this decision.
#[derive(Debug, Clone, PartialEq)]
pub struct PreflightVerdict {
    /// A preflight should run now (or keeps running).
    pub due: bool,
    /// Updates wait, and why.
    pub hold: Option<String>,
    /// The `Preflight` condition, once there is anything to say.
    pub condition: Option<ConditionUpdate>,
    /// The digest of the preflight of this template on the current inputs, when there is one: an
    /// approval that names a digest counts only for this one.
    pub digest: Option<String>,
}

/// The preflight's say in one decision.
pub fn preflight_verdict(facts: &PreflightFacts<'_>) -> PreflightVerdict {
    let of_template = facts
        .last
        .filter(|last| last.template_hash == facts.template_hash);
    let asked = facts
        .requested
        .is_some_and(|r| facts.last.is_none_or(|last| last.request != r));
    let stale = of_template.is_none_or(|last| last.inputs_hash != facts.inputs_hash);
    let due = asked || (facts.anything_to_update && stale);
    let holds = facts.on_refusal == PreflightOnRefusal::Hold && !facts.rolling_back;
    let verdict = |hold: Option<String>, condition: Option<ConditionUpdate>| PreflightVerdict {
        due,
        hold,
        condition,
        // What was reviewed holds only while the preflight is of the current targets: one that runs
        // again may find a change nobody reviewed.
        digest: of_template.filter(|_| !stale).map(|l| l.digest.clone()),
    };
    let Some(last) = of_template else {
        if !facts.anything_to_update {
            return verdict(None, None);
        }
        let message = format!(
            "The preflight of template {} runs{}.",
            facts.template_hash,
            if holds { "; updates wait for it" } else { "" }
        );
        let condition = ConditionUpdate::new(PREFLIGHT, false, "Running", message.clone());
        return verdict(holds.then_some(message), Some(condition));
    };
    let again = if due {
        " It runs again: the targets or their data changed."
    } else {
        ""
    };
    if last.refused == 0 {
        let message = format!(
            "Preflight of template {}: {} of {} namespaces change, in {} groups; none refused (digest {}).{again}",
            facts.template_hash, last.changed, last.namespaces, last.groups.len(), last.digest
        );
        return verdict(
            None,
            Some(ConditionUpdate::new(PREFLIGHT, true, "NoRefusal", message)),
        );
    }
    let first = last
        .refusals
        .first()
        .map(|r| format!(" (first: {}: {}: {})", r.namespace, r.object, r.message))
        .unwrap_or_default();
    let found = format!(
        "Preflight of template {}: the apiserver refused the change in {} of {} namespaces{first}.",
        facts.template_hash, last.refused, last.namespaces
    );
    let acceptance = facts
        .accepted
        .filter(|a| a.template_hash == facts.template_hash);
    if acceptance.is_some_and(|a| !stale && a.preflight_digest == last.digest) {
        let message = format!("{found} Accepted for digest {}.{again}", last.digest);
        let condition = ConditionUpdate::new(PREFLIGHT, true, "RefusalAccepted", message);
        return verdict(None, Some(condition));
    }
    let next = if holds {
        format!(
            " Updates hold: see kubectl package rollout diff hostedclusterpackage/<name>, fix the template, or accept digest {} with kubectl package rollout approve hostedclusterpackage/<name> --preflight.",
            last.digest
        )
    } else {
        " The policy proceeds (onRefusal: Proceed).".to_owned()
    };
    let not_this = acceptance
        .filter(|a| a.preflight_digest != last.digest)
        .map(|a| {
            format!(
                " The acceptance on the object names digest {}, not this change.",
                a.preflight_digest
            )
        })
        .unwrap_or_default();
    let message = format!("{found}{next}{not_this}{again}");
    let condition = ConditionUpdate::new(PREFLIGHT, false, "Refused", message);
    verdict(holds.then_some(found), Some(condition))
}

/// A preflight to run: of which template, on which inputs, answering which request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightRun {
    pub template_hash: String,
    pub inputs_hash: String,
    pub request: String,
}

/// The preflight's say in the decision on `hcpkg` (its targets `clusters`, its `packages`), with `last`
/// the newest finished preflight known (the status's, or a newer one not written yet): the verdict,
/// and the preflight to run when one is due.
pub fn step_preflight(
    hcpkg: &HostedClusterPackage,
    clusters: &[Arc<HostedCluster>],
    packages: &BTreeMap<String, Arc<OwnedPackage>>,
    last: Option<&HostedClusterPackagePreflightStatus>,
    rolling_back: bool,
) -> (PreflightVerdict, Option<PreflightRun>) {
    let template_hash = package_template_hash(&hcpkg.spec);
    let annotations = hcpkg.metadata.annotations.as_ref();
    let requested = annotations.and_then(|a| a.get(ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION));
    let accepted: Option<RolloutApproval> = annotations
        .and_then(|a| a.get(ROLLOUT_PREFLIGHT_APPROVAL_ANNOTATION))
        .and_then(|text| serde_json::from_str(text).ok());
    let to_update = anything_to_update(&hcpkg.spec.template, packages);
    // Hashing every target's data is skipped when nothing could make a preflight due.
    let inputs_hash = if hashes_targets(hcpkg, packages) {
        preflight_inputs_hash(&template_hash, clusters)
    } else {
        last.map(|l| l.inputs_hash.clone()).unwrap_or_default()
    };
    let verdict = preflight_verdict(&PreflightFacts {
        on_refusal: hcpkg
            .spec
            .rollout_policy
            .as_ref()
            .map(|p| p.preflight.on_refusal)
            .unwrap_or_default(),
        template_hash: &template_hash,
        inputs_hash: &inputs_hash,
        last,
        requested: requested.map(String::as_str),
        accepted: accepted.as_ref(),
        anything_to_update: to_update,
        rolling_back,
    });
    let run = verdict.due.then(|| PreflightRun {
        template_hash,
        inputs_hash,
        request: requested.cloned().unwrap_or_default(),
    });
    (verdict, run)
}

/// A preflight of `template_hash` that found nothing refused (tests of what else decides a rollout).
#[cfg(test)]
pub(crate) fn passed_preflight(template_hash: &str) -> HostedClusterPackagePreflightStatus {
    HostedClusterPackagePreflightStatus {
        template_hash: template_hash.to_owned(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::core::rollout_preflight::PreflightRefusal;

    fn found(refused: i32) -> HostedClusterPackagePreflightStatus {
        HostedClusterPackagePreflightStatus {
            template_hash: "h2".into(),
            inputs_hash: "i1".into(),
            digest: "d1".into(),
            namespaces: 5,
            changed: 5,
            refused,
            refusals: (refused > 0)
                .then(|| PreflightRefusal {
                    namespace: "clusters-b".into(),
                    object: "apps/v1 StatefulSet db".into(),
                    message: "Forbidden".into(),
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn facts(last: Option<&HostedClusterPackagePreflightStatus>) -> PreflightFacts<'_> {
        PreflightFacts {
            on_refusal: PreflightOnRefusal::Hold,
            template_hash: "h2",
            inputs_hash: "i1",
            last,
            requested: None,
            accepted: None,
            anything_to_update: true,
            rolling_back: false,
        }
    }

    fn reason(v: &PreflightVerdict) -> Option<(bool, &str)> {
        v.condition.as_ref().map(|c| (c.status, c.reason.as_str()))
    }

    #[test]
    fn updates_wait_for_the_first_preflight_of_a_template_unless_the_policy_proceeds() {
        let older = HostedClusterPackagePreflightStatus {
            template_hash: "h1".into(),
            ..found(0)
        };
        let waiting = preflight_verdict(&facts(Some(&older)));
        assert!(waiting.due && waiting.hold.is_some());
        assert_eq!(reason(&waiting), Some((false, "Running")));
        let proceeding = preflight_verdict(&PreflightFacts {
            on_refusal: PreflightOnRefusal::Proceed,
            ..facts(None)
        });
        assert!(proceeding.due && proceeding.hold.is_none());
        let nothing = preflight_verdict(&PreflightFacts {
            anything_to_update: false,
            ..facts(None)
        });
        assert_eq!(
            nothing,
            PreflightVerdict {
                due: false,
                hold: None,
                condition: None,
                digest: None,
            }
        );
        let rolling_back = preflight_verdict(&PreflightFacts {
            rolling_back: true,
            ..facts(None)
        });
        assert!(
            rolling_back.hold.is_none(),
            "a rollback goes back to what ran before"
        );
    }

    #[test]
    fn a_refusal_holds_until_accepted_for_its_digest() {
        let last = found(1);
        let held = preflight_verdict(&facts(Some(&last)));
        assert!(!held.due);
        assert_eq!(reason(&held), Some((false, "Refused")));
        let message = &held.condition.as_ref().unwrap().message;
        assert!(message.contains("refused the change in 1 of 5 namespaces (first: clusters-b: apps/v1 StatefulSet db: Forbidden)"), "{message}");
        assert!(
            message.contains("accept digest d1 with kubectl package rollout approve"),
            "{message}"
        );
        assert!(held.hold.is_some());
        let approval = |template: &str, digest: &str| RolloutApproval {
            template_hash: template.into(),
            preflight_digest: digest.into(),
            ..Default::default()
        };
        for (other, why) in [
            (approval("h2", "d0"), "another digest"),
            (approval("h1", "d1"), "another template"),
        ] {
            let v = preflight_verdict(&PreflightFacts {
                accepted: Some(&other),
                ..facts(Some(&last))
            });
            assert!(v.hold.is_some(), "{why} accepts nothing");
        }
        let ok = approval("h2", "d1");
        let accepted = preflight_verdict(&PreflightFacts {
            accepted: Some(&ok),
            ..facts(Some(&last))
        });
        assert!(accepted.hold.is_none());
        assert_eq!(reason(&accepted), Some((true, "RefusalAccepted")));
        let clean = found(0);
        assert_eq!(
            reason(&preflight_verdict(&facts(Some(&clean)))),
            Some((true, "NoRefusal"))
        );
    }

    #[test]
    fn new_inputs_or_a_request_run_it_again_without_waiting_for_it() {
        let last = found(0);
        let joined = preflight_verdict(&PreflightFacts {
            inputs_hash: "i2",
            ..facts(Some(&last))
        });
        assert!(
            joined.due && joined.hold.is_none(),
            "the rollout under way goes on meanwhile"
        );
        assert!(joined
            .condition
            .unwrap()
            .message
            .ends_with("It runs again: the targets or their data changed."));
        let done = PreflightFacts {
            anything_to_update: false,
            inputs_hash: "i2",
            ..facts(Some(&last))
        };
        assert!(
            !preflight_verdict(&done).due,
            "a finished rollout does no preflight work"
        );
        let asked = preflight_verdict(&PreflightFacts {
            requested: Some("now"),
            ..done
        });
        assert!(asked.due);
        let answered = HostedClusterPackagePreflightStatus {
            request: "now".into(),
            ..found(0)
        };
        assert!(
            !preflight_verdict(&PreflightFacts {
                requested: Some("now"),
                last: Some(&answered),
                ..done
            })
            .due
        );
    }
}
