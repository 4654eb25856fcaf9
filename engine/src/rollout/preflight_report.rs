//! The fleet's view of a release's preflight (pko extension, issue 43): HCP namespaces grouped by
//! identical change (`engine::rollout::preflight_diff`), a SHA-256 digest per group and one over all of
//! them (what an approval names), each group's objects with their fields, verdicts and unified diffs
//! (written once per group), and the compact form `status.preflight` keeps. Pure.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pko_package::canonical_hash::{hex, value_digest};
use pko_proto::core::rollout_preflight::{
    HostedClusterPackagePreflightStatus, PreflightGroup, PreflightGroupSummary,
    PreflightObjectChange, PreflightRefusal, PreflightReport,
};
use serde_json::{json, Value};

use crate::rollout::preflight_diff::{
    identity, normalized, Action, NamespaceChange, NamespacePreflight, NormalizedChange,
    ObjectChange, Verdict,
};

/// Changed fields named per object; the rest are counted.
const NAMED_FIELDS: usize = 20;
/// Groups the status lists (the report has all).
const STATUS_GROUPS: usize = 10;
/// Refusals the status names.
const STATUS_REFUSALS: usize = 5;
/// A group's summary line is cut here.
const SUMMARY_LIMIT: usize = 300;
/// The report stays below this many bytes of diff text, so it fits a ConfigMap (1 MiB) with room to
/// spare; groups past it keep their namespaces, fields and verdicts but lose their diffs.
pub const REPORT_DIFF_BUDGET: usize = 512 * 1024;

fn yaml(value: Option<&Value>) -> String {
    value
        .map(|v| serde_saphyr::to_string(v).unwrap_or_else(|e| format!("# not shown: {e}\n")))
        .unwrap_or_default()
}

/// Objects whose YAML (both sides together) is larger than this get no diff text, only their fields:
/// a line diff's work grows with the product of the lines that differ.
const DIFF_INPUT_LIMIT: usize = 256 * 1024;

/// How long a report's diffs may take together; the caller sets the deadline from it.
pub const REPORT_DIFF_TIME: Duration = Duration::from_secs(10);

fn unified_diff(label: &str, change: &ObjectChange, deadline: Instant) -> String {
    let old = yaml(change.before.as_ref());
    let new = yaml(change.after.as_ref());
    if old.len() + new.len() > DIFF_INPUT_LIMIT {
        return format!(
            "# {label}: {} bytes of YAML, over the {} KiB a diff is shown for; see its fields\n",
            old.len() + new.len(),
            DIFF_INPUT_LIMIT / 1024
        );
    }
    similar::TextDiff::configure()
        .deadline(deadline)
        .diff_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{label}"), &format!("b/{label}"))
        .to_string()
}

/// What a group's digest covers: each object's identity, action, both sides and verdict, or why the
/// namespace was not compared.
fn group_digest(changes: &NamespaceChange) -> String {
    let value = match changes {
        Ok(changes) => Value::Array(
            changes
                .iter()
                .map(|c| {
                    json!([
                        c.phase,
                        c.hosted,
                        c.object,
                        c.action.label(),
                        c.change.before,
                        c.change.after,
                        c.verdict.label(),
                        c.verdict.message()
                    ])
                })
                .collect(),
        ),
        Err(why) => json!({ "unchecked": why }),
    };
    hex(&value_digest(&value))[..16].to_owned()
}

fn cut(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The last two segments of a field path: `containers[addon].image`.
fn short_field(path: &str) -> &str {
    let mut dots = path.rmatch_indices('.').map(|(i, _)| i);
    match (dots.next(), dots.next()) {
        (Some(_), Some(second)) => &path[second + 1..],
        _ => path,
    }
}

fn group_summary(changes: &NamespaceChange) -> String {
    let changes = match changes {
        Err(why) => return cut(&format!("not compared: {why}"), SUMMARY_LIMIT),
        Ok(c) if c.is_empty() => return "no change".to_owned(),
        Ok(c) => c,
    };
    let objects: Vec<String> = changes
        .iter()
        .map(|c| {
            let (_, kind, _, name) = identity(c.change.object());
            let what = match c.action {
                Action::Create => "created".to_owned(),
                Action::Delete => "deleted".to_owned(),
                Action::Update => {
                    let named: Vec<&str> =
                        c.fields.iter().take(3).map(|f| short_field(f)).collect();
                    let more = if c.fields.len() > 3 { ", …" } else { "" };
                    let noun = if c.fields.len() == 1 {
                        "field"
                    } else {
                        "fields"
                    };
                    format!("{} {noun} ({}{more})", c.fields.len(), named.join(", "))
                }
            };
            let verdict = match &c.verdict {
                Verdict::Refused(m) => format!(" — refused by the apiserver: {m}"),
                _ => String::new(),
            };
            format!("{kind} {name}: {what}{verdict}")
        })
        .collect();
    cut(&objects.join("; "), SUMMARY_LIMIT)
}

/// One namespace's preflight reduced to what the fleet's report needs: its name, the digest of its
/// change, and the change itself (normalized; kept only for a digest not seen before).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupedNamespace {
    namespace: String,
    digest: String,
    change: NamespaceChange,
}

impl GroupedNamespace {
    /// `ns` normalized and digested (the CPU of the grouping: run it off the actor threads).
    pub fn of(ns: &NamespacePreflight) -> Self {
        let change = normalized(ns);
        Self {
            namespace: ns.namespace.clone(),
            digest: group_digest(&change),
            change,
        }
    }
}

/// The fleet grouped by identical change as namespaces come in: one exemplar change per digest and the
/// names of the namespaces that share it, so a 500-namespace preflight of a large object holds the
/// object once per distinct change, not once per namespace.
#[derive(Debug, Default)]
pub struct PreflightGroups {
    groups: BTreeMap<String, (NamespaceChange, Vec<String>)>,
}

impl PreflightGroups {
    pub fn insert(&mut self, grouped: GroupedNamespace) {
        let GroupedNamespace {
            namespace,
            digest,
            change,
        } = grouped;
        self.groups
            .entry(digest)
            .or_insert_with(|| (change, Vec::new()))
            .1
            .push(namespace);
    }

    /// The full report: groups largest first (then by digest), each with its objects' fields, verdicts
    /// and diffs (written once per group), and the digest over all groups. Diffs stop once
    /// [`REPORT_DIFF_BUDGET`] bytes are written or at `diff_deadline` (a line diff's work grows with
    /// the product of the lines that differ); the groups after that keep everything but their diffs.
    pub fn report(
        self,
        template_hash: &str,
        inputs_hash: &str,
        finished_at: &str,
        diff_deadline: Instant,
    ) -> PreflightReport {
        let digest = hex(&value_digest(&json!({
            "templateHash": template_hash,
            "groups": self.groups.keys().collect::<Vec<_>>(),
        })));
        let mut ordered: Vec<_> = self.groups.into_iter().collect();
        ordered.sort_by(|(da, (_, a)), (db, (_, b))| b.len().cmp(&a.len()).then(da.cmp(db)));
        let mut budget = REPORT_DIFF_BUDGET;
        let (mut over_budget, mut over_time) = (0, 0);
        let groups = ordered
            .into_iter()
            .map(|(digest, (changes, mut members))| {
                members.sort();
                let summary = group_summary(&changes);
                let (objects, unchecked) = match changes {
                    Ok(changes) => (changes, None),
                    Err(why) => (Vec::new(), Some(why)),
                };
                let objects = objects
                    .into_iter()
                    .map(|c| {
                        // The budget and the clock first: a diff not shown is not computed.
                        let diff = if budget == 0 {
                            over_budget += 1;
                            String::new()
                        } else if Instant::now() >= diff_deadline {
                            over_time += 1;
                            String::new()
                        } else {
                            match unified_diff(&c.object, &c.change, diff_deadline) {
                                diff if diff.len() > budget => {
                                    over_budget += 1;
                                    String::new()
                                }
                                diff => diff,
                            }
                        };
                        budget -= diff.len();
                        object_change(c, diff)
                    })
                    .collect();
                PreflightGroup {
                    digest,
                    namespaces: members,
                    summary,
                    objects,
                    unchecked,
                }
            })
            .collect();
        let mut left_out = Vec::new();
        if over_budget > 0 {
            left_out.push(format!(
                "{over_budget} objects' diffs are left out: the report keeps at most {} KiB of diffs",
                REPORT_DIFF_BUDGET / 1024
            ));
        }
        if over_time > 0 {
            left_out.push(format!(
                "{over_time} objects' diffs are left out: diffing took longer than the preflight \
                 allows ({} s)",
                REPORT_DIFF_TIME.as_secs()
            ));
        }
        PreflightReport {
            template_hash: template_hash.to_owned(),
            inputs_hash: inputs_hash.to_owned(),
            digest,
            finished_at: finished_at.to_owned(),
            groups,
            truncated: (!left_out.is_empty()).then(|| left_out.join("; ")),
        }
    }
}

fn object_change(c: NormalizedChange, diff: String) -> PreflightObjectChange {
    let mut fields = c.fields;
    if fields.len() > NAMED_FIELDS {
        let more = fields.len() - NAMED_FIELDS;
        fields.truncate(NAMED_FIELDS);
        fields.push(format!("… and {more} more"));
    }
    PreflightObjectChange {
        phase: c.phase,
        hosted: c.hosted,
        object: c.object,
        action: c.action.label().to_owned(),
        fields,
        verdict: c.verdict.label().to_owned(),
        message: c.verdict.message().to_owned(),
        diff,
    }
}

/// The compact form of `report` for `status.preflight`; `report_ref` names where the report is kept,
/// `request` the request annotation's value the preflight answered.
pub fn preflight_status(
    report: &PreflightReport,
    report_ref: &str,
    request: &str,
) -> HostedClusterPackagePreflightStatus {
    let count = |keep: &dyn Fn(&PreflightGroup) -> bool| -> i32 {
        let n: usize = report
            .groups
            .iter()
            .filter(|g| keep(g))
            .map(|g| g.namespaces.len())
            .sum();
        i32::try_from(n).unwrap_or(i32::MAX)
    };
    let refused = |g: &PreflightGroup| g.objects.iter().any(|o| o.verdict == "Refused");
    let unchecked = |g: &PreflightGroup| {
        g.unchecked.is_some() || g.objects.iter().any(|o| o.verdict == "Unchecked")
    };
    let refusals = report
        .groups
        .iter()
        .flat_map(|g| {
            g.objects
                .iter()
                .filter(|o| o.verdict == "Refused")
                .map(move |o| PreflightRefusal {
                    namespace: g.namespaces.first().cloned().unwrap_or_default(),
                    object: o.object.clone(),
                    message: cut(&o.message, SUMMARY_LIMIT),
                })
        })
        .take(STATUS_REFUSALS)
        .collect();
    HostedClusterPackagePreflightStatus {
        template_hash: report.template_hash.clone(),
        inputs_hash: report.inputs_hash.clone(),
        digest: report.digest.clone(),
        finished_at: report.finished_at.clone(),
        namespaces: count(&|_| true),
        changed: count(&|g| !g.objects.is_empty()),
        refused: count(&refused),
        unchecked: count(&unchecked),
        groups: report
            .groups
            .iter()
            .take(STATUS_GROUPS)
            .map(|g| PreflightGroupSummary {
                digest: g.digest.clone(),
                namespaces: i32::try_from(g.namespaces.len()).unwrap_or(i32::MAX),
                summary: g.summary.clone(),
                refused: refused(g),
            })
            .collect(),
        refusals,
        report: report_ref.to_owned(),
        report_error: String::new(),
        request: request.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rollout::preflight_diff::{object_changes, PhaseObjects};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    fn preflight_report(
        template_hash: &str,
        inputs_hash: &str,
        finished_at: &str,
        namespaces: &[NamespacePreflight],
    ) -> PreflightReport {
        let mut groups = PreflightGroups::default();
        for ns in namespaces {
            groups.insert(GroupedNamespace::of(ns));
        }
        groups.report(template_hash, inputs_hash, finished_at, far())
    }

    fn deployment(namespace: &str, image: &str, level: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "addon", "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{"name": "addon", "image": image,
                "env": [{"name": "HOME_NS", "value": namespace}, {"name": "LEVEL", "value": level}]}]}}}})
    }

    fn statefulset(size: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
            "spec": {"volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"resources": {"requests": {"storage": size}}}}]}})
    }

    fn phase(objects: Vec<Value>) -> Vec<PhaseObjects> {
        vec![PhaseObjects {
            phase: "deploy".into(),
            hosted: false,
            objects,
        }]
    }

    /// A namespace going from image v1 to v2, with the StatefulSet's claim grown (refused) when `grow`.
    fn namespace(ns: &str, grow: bool) -> NamespacePreflight {
        let current = phase(vec![deployment(ns, "addon:v1", "info"), statefulset("1Gi")]);
        let size = if grow { "2Gi" } else { "1Gi" };
        let rendered = phase(vec![deployment(ns, "addon:v2", "debug"), statefulset(size)]);
        let outcome = object_changes(&current, &rendered)
            .into_iter()
            .map(|c| {
                let verdict = if c.object()["kind"] == "StatefulSet" {
                    Verdict::Refused(format!(
                        "StatefulSet.apps \"db\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas' are forbidden (namespace {ns})"
                    ))
                } else {
                    Verdict::Accepted
                };
                (c, verdict)
            })
            .collect();
        NamespacePreflight {
            namespace: ns.into(),
            hosted_cluster: Some(ns.trim_start_matches("clusters-").into()),
            outcome: Ok(outcome),
        }
    }

    #[test]
    fn namespaces_with_the_same_change_are_one_group_and_refusals_another() {
        let fleet = vec![
            namespace("clusters-a", false),
            namespace("clusters-b", true),
            namespace("clusters-c", false),
            namespace("clusters-d", false),
        ];
        let report = preflight_report("h1", "i1", "2026-11-29T00:00:00Z", &fleet);
        assert_eq!(report.groups.len(), 2, "{report:#?}");
        let (big, refused) = (&report.groups[0], &report.groups[1]);
        assert_eq!(big.namespaces, ["clusters-a", "clusters-c", "clusters-d"]);
        assert_eq!(
            big.summary,
            "Deployment addon: 2 fields (env[LEVEL].value, containers[addon].image)"
        );
        assert_eq!(big.objects[0].verdict, "Accepted");
        let diff = &big.objects[0].diff;
        assert!(
            diff.starts_with("--- a/apps/v1 Deployment addon in $(namespace)\n"),
            "{diff}"
        );
        for line in [
            "-        image: addon:v1\n",
            "+        image: addon:v2\n",
            "+          value: debug\n",
        ] {
            assert!(diff.contains(line), "{line} missing: {diff}");
        }
        assert!(big.objects[0].diff.contains("value: $(namespace)"));
        assert_eq!(refused.namespaces, ["clusters-b"]);
        assert_eq!(refused.objects[1].verdict, "Refused");
        assert!(refused.objects[1]
            .message
            .ends_with("(namespace $(namespace))"));
        assert!(refused.summary.contains(
            "StatefulSet db: 1 field (requests.storage) — refused by the apiserver: StatefulSet.apps"
        ), "{}", refused.summary);

        let status = preflight_status(&report, "pko/preflight-addon", "");
        assert_eq!(
            (
                status.namespaces,
                status.changed,
                status.refused,
                status.unchecked
            ),
            (4, 4, 1, 0)
        );
        assert_eq!(status.refusals[0].namespace, "clusters-b");
        assert!(status.groups[1].refused && !status.groups[0].refused);
        assert_eq!(status.digest, report.digest);
    }

    #[test]
    fn the_digest_follows_the_change_not_the_number_of_namespaces() {
        let digest = |fleet: &[NamespacePreflight]| preflight_report("h1", "i", "t", fleet).digest;
        let base = digest(&[
            namespace("clusters-a", false),
            namespace("clusters-b", true),
        ]);
        let joined_alike = digest(&[
            namespace("clusters-a", false),
            namespace("clusters-b", true),
            namespace("clusters-e", false),
        ]);
        assert_eq!(
            base, joined_alike,
            "one more namespace with a reviewed change"
        );
        let mut other = namespace("clusters-e", false);
        if let Ok(changes) = &mut other.outcome {
            changes[0].0.after.as_mut().unwrap()["spec"]["replicas"] = json!(3);
        }
        let joined_other = digest(&[
            namespace("clusters-a", false),
            namespace("clusters-b", true),
            other,
        ]);
        assert_ne!(
            base, joined_other,
            "a namespace joined with a change nobody reviewed"
        );
        assert_ne!(
            base,
            preflight_report(
                "h2",
                "i",
                "t",
                &[
                    namespace("clusters-a", false),
                    namespace("clusters-b", true)
                ]
            )
            .digest,
            "another template"
        );
    }

    #[test]
    fn secret_values_are_neither_shown_nor_hashed() {
        let secret = |password: &str, user: &str| {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "data": {"password": password, "user": user}})
        };
        let ns = |name: &str, old: &str, new: &str| NamespacePreflight {
            namespace: name.into(),
            hosted_cluster: None,
            outcome: Ok(object_changes(
                &phase(vec![secret(old, "YWRtaW4=")]),
                &phase(vec![secret(new, "YWRtaW4=")]),
            )
            .into_iter()
            .map(|c| (c, Verdict::Accepted))
            .collect()),
        };
        let report = preflight_report(
            "h",
            "i",
            "t",
            &[
                ns("x", "c2VjcmV0MQ==", "c2VjcmV0Mg=="),
                ns("y", "b3RoZXIx", "b3RoZXIy"),
            ],
        );
        assert_eq!(report.groups.len(), 1, "only which keys changed counts");
        let object = &report.groups[0].objects[0];
        assert_eq!(object.fields, ["data.password"]);
        for value in ["c2VjcmV0", "b3RoZXI", "YWRtaW4="] {
            assert!(
                !object.diff.contains(value),
                "{value} shown: {}",
                object.diff
            );
        }
        assert!(
            object.diff.contains("-  password: (redacted, old)"),
            "{}",
            object.diff
        );
        assert!(object.diff.contains("   user: (redacted)"));
    }

    #[test]
    fn a_huge_object_is_summed_up_not_diffed() {
        let big = |v: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                "data": {"blob": v.repeat(200_000)}})
        };
        let change = ObjectChange {
            phase: "p".into(),
            hosted: false,
            before: Some(big("a")),
            after: Some(big("b")),
        };
        let diff = unified_diff("v1 ConfigMap big", &change, far());
        assert!(diff.starts_with("# v1 ConfigMap big: 400"), "{diff}");
        assert!(diff.len() < 200);
    }

    proptest! {
        /// Whatever the order namespaces come in and whichever change each has, every namespace is in
        /// exactly one group, namespaces with the same change share it, and the digest is the same.
        #[test]
        fn groups_partition_the_fleet_whatever_its_order(
            grows in proptest::collection::vec(any::<bool>(), 1..12),
            rotate in 0usize..12,
        ) {
            let fleet: Vec<NamespacePreflight> = grows
                .iter()
                .enumerate()
                .map(|(i, grow)| namespace(&format!("clusters-n{i}"), *grow))
                .collect();
            let mut shuffled = fleet.clone();
            shuffled.rotate_left(rotate % fleet.len());
            let a = preflight_report("h", "i", "t", &fleet);
            let b = preflight_report("h", "i", "t", &shuffled);
            prop_assert_eq!(&a, &b);
            let mut seen: Vec<&String> = a.groups.iter().flat_map(|g| &g.namespaces).collect();
            seen.sort();
            prop_assert_eq!(seen.len(), fleet.len());
            seen.dedup();
            prop_assert_eq!(seen.len(), fleet.len());
            let kinds: BTreeSet<bool> = grows.iter().copied().collect();
            prop_assert_eq!(a.groups.len(), kinds.len());
        }
    }

    #[test]
    fn a_change_shared_by_many_namespaces_is_kept_once() {
        let mut groups = PreflightGroups::default();
        for i in 0..50 {
            groups.insert(GroupedNamespace::of(&namespace(
                &format!("clusters-n{i}"),
                i == 7,
            )));
        }
        assert_eq!(groups.groups.len(), 2);
        let members: Vec<usize> = groups.groups.values().map(|(_, m)| m.len()).collect();
        assert_eq!(members.iter().sum::<usize>(), 50);
        assert!(members.contains(&49) && members.contains(&1), "{members:?}");
    }

    #[test]
    fn diffs_stop_at_the_budget_and_at_the_deadline() {
        // Three distinct changes of about 240 KiB of diff each: the third is over the 512 KiB budget.
        let blob = |n: usize, v: &str| {
            let data: serde_json::Map<String, Value> = (0..1_800)
                .map(|i| {
                    (
                        format!("k{n}-{i:05}"),
                        json!(format!("{v}{}", "x".repeat(48))),
                    )
                })
                .collect();
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                "data": data})
        };
        let fleet: Vec<NamespacePreflight> = (0..3)
            .map(|n| NamespacePreflight {
                namespace: format!("clusters-n{n}"),
                hosted_cluster: None,
                outcome: Ok(vec![(
                    ObjectChange {
                        phase: "p".into(),
                        hosted: false,
                        before: Some(blob(n, "old")),
                        after: Some(blob(n, "new")),
                    },
                    Verdict::Accepted,
                )]),
            })
            .collect();
        let report = preflight_report("h", "i", "t", &fleet);
        let shown = report
            .groups
            .iter()
            .filter(|g| !g.objects[0].diff.is_empty())
            .count();
        assert_eq!(shown, 2, "{:?}", report.truncated);
        let total: usize = report.groups.iter().map(|g| g.objects[0].diff.len()).sum();
        assert!(total <= REPORT_DIFF_BUDGET, "{total}");
        assert!(
            report
                .truncated
                .as_deref()
                .unwrap()
                .starts_with("1 objects' diffs are left out: the report keeps"),
            "{:?}",
            report.truncated
        );
        // With the deadline passed nothing is diffed; every group keeps its fields and verdicts.
        let mut groups = PreflightGroups::default();
        for ns in &fleet {
            groups.insert(GroupedNamespace::of(ns));
        }
        let late = groups.report("h", "i", "t", Instant::now());
        assert!(late.groups.iter().all(|g| g.objects[0].diff.is_empty()
            && g.objects[0].verdict == "Accepted"
            && !g.objects[0].fields.is_empty()));
        assert!(
            late.truncated
                .as_deref()
                .unwrap()
                .contains("3 objects' diffs are left out: diffing took longer"),
            "{:?}",
            late.truncated
        );
        assert_eq!(
            late.digest, report.digest,
            "the digest does not depend on the diffs"
        );
    }
}
