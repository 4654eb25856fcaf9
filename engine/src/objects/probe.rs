//! The probe engine: decides whether one observed object passes the availability probes of its phase.
//!
//! Owns probe compilation (CEL rules are parsed once, and a broken rule is reported with the field that holds
//! it), selector matching, and the three probe kinds of the API (`condition`, `fieldsEqual`, `cel`) plus the
//! stale-`observedGeneration` rule. It must not fetch objects or write anything: callers hand it JSON.

use std::sync::Arc;

use pko_package::cel::{compile_bounded, evaluate_cel_with, CelRule};
use pko_proto::core::common::{ObjectSetProbe, Probe, ProbeSelector};
use serde_json::Value;

use crate::label_selector::{selector_matches, SelectorError};
use crate::objects::object_ref::ObjectKey;

/// A probe set that cannot be evaluated because the spec is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeSpecError {
    /// A CEL rule does not parse.
    #[error("{field}: invalid CEL rule {rule:?}: {message}")]
    InvalidCel {
        field: String,
        rule: String,
        message: String,
    },
    /// A probe sets none of `condition`, `fieldsEqual` and `cel`, or more than one.
    #[error("{field}: exactly one of condition, fieldsEqual or cel must be set")]
    AmbiguousProbe { field: String },
    /// A label selector is malformed.
    #[error("{field}: {source}")]
    Selector {
        field: String,
        #[source]
        source: SelectorError,
    },
}

/// Outcome of probing one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// Every probe selecting the object passed (or none selected it).
    Passed,
    /// At least one probe failed; messages say which and why, in probe order.
    Failed(Vec<String>),
    /// Every failing probe failed only because the object's status does not speak for its current
    /// generation yet (no status, stale `observedGeneration`, a condition or field not written yet):
    /// its controller has not reported on the change.
    Pending(Vec<String>),
}

impl ProbeResult {
    pub fn passed(&self) -> bool {
        matches!(self, ProbeResult::Passed)
    }
}

enum CompiledCheck {
    Condition {
        type_: String,
        status: String,
    },
    FieldsEqual {
        field_a: String,
        field_b: String,
    },
    Cel {
        program: Arc<CelRule>,
        message: String,
    },
}

struct CompiledGroup {
    selector: ProbeSelector,
    checks: Vec<CompiledCheck>,
}

/// Availability probes compiled once per spec, evaluated many times.
pub struct ProbeSet {
    groups: Vec<CompiledGroup>,
}

impl std::fmt::Debug for ProbeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSet")
            .field("groups", &self.groups.len())
            .finish()
    }
}

impl ProbeSet {
    /// Compiles `availabilityProbes`; `field` is the path of the list in the owning spec (for error messages).
    pub fn compile(probes: &[ObjectSetProbe], field: &str) -> Result<Self, ProbeSpecError> {
        let mut groups = Vec::with_capacity(probes.len());
        for (gi, group) in probes.iter().enumerate() {
            let group_field = format!("{field}[{gi}]");
            if let Some(sel) = &group.selector.selector {
                // Validate the selector now so a malformed one fails the spec, not each evaluation.
                selector_matches(sel, &Default::default()).map_err(|source| {
                    ProbeSpecError::Selector {
                        field: format!("{group_field}.selector.selector"),
                        source,
                    }
                })?;
            }
            let mut checks = Vec::with_capacity(group.probes.len());
            for (pi, probe) in group.probes.iter().enumerate() {
                checks.push(compile_probe(
                    probe,
                    &format!("{group_field}.probes[{pi}]"),
                )?);
            }
            groups.push(CompiledGroup {
                selector: group.selector.clone(),
                checks,
            });
        }
        Ok(Self { groups })
    }

    /// No probes: every object passes.
    pub fn empty() -> Self {
        Self { groups: Vec::new() }
    }

    /// True when no probe is configured at all.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// True when a probe runs a CEL rule: the costly kind, which callers evaluate off their actor thread.
    pub fn has_cel(&self) -> bool {
        self.groups
            .iter()
            .flat_map(|g| &g.checks)
            .any(|c| matches!(c, CompiledCheck::Cel { .. }))
    }

    /// Probes one observed object; `api_group` and `kind` identify it for the selectors.
    pub fn evaluate(&self, key: &ObjectKey, object: &Value) -> ProbeResult {
        let labels = labels_of(object);
        let mut messages = Vec::new();
        // Set by a check that fails on a status written for the current generation.
        let mut failed = false;
        for group in &self.groups {
            if !selects(&group.selector, key, &labels) {
                continue;
            }
            if let Some(stale) = stale_status(object) {
                messages.push(stale);
                continue;
            }
            for check in &group.checks {
                if let Err(message) = run_check(check, object) {
                    failed |= !not_reported_yet(check, object);
                    messages.push(message);
                }
            }
        }
        match (messages.is_empty(), failed) {
            (true, _) => ProbeResult::Passed,
            (false, true) => ProbeResult::Failed(messages),
            (false, false) => ProbeResult::Pending(messages),
        }
    }
}

fn compile_probe(probe: &Probe, field: &str) -> Result<CompiledCheck, ProbeSpecError> {
    match (&probe.condition, &probe.fields_equal, &probe.cel) {
        (Some(c), None, None) => Ok(CompiledCheck::Condition {
            type_: c.type_.clone(),
            status: c.status.clone(),
        }),
        (None, Some(f), None) => Ok(CompiledCheck::FieldsEqual {
            field_a: f.field_a.clone(),
            field_b: f.field_b.clone(),
        }),
        (None, None, Some(c)) => {
            let program =
                compile_bounded(&c.rule).map_err(|message| ProbeSpecError::InvalidCel {
                    field: format!("{field}.cel.rule"),
                    rule: c.rule.clone(),
                    message,
                })?;
            Ok(CompiledCheck::Cel {
                program: Arc::new(program),
                message: c.message.clone(),
            })
        }
        _ => Err(ProbeSpecError::AmbiguousProbe {
            field: field.to_owned(),
        }),
    }
}

fn labels_of(object: &Value) -> std::collections::BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn selects(
    selector: &ProbeSelector,
    key: &ObjectKey,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    if selector.kind.kind != key.kind || selector.kind.group != key.group {
        return false;
    }
    match &selector.selector {
        // Compile-time validation makes the error arm unreachable in practice; treat it as "not selected".
        Some(sel) => selector_matches(sel, labels).unwrap_or(false),
        None => true,
    }
}

/// A status written for an older generation says nothing about the current spec.
fn stale_status(object: &Value) -> Option<String> {
    let observed = object.pointer("/status/observedGeneration")?.as_i64()?;
    let generation = object.pointer("/metadata/generation")?.as_i64()?;
    (observed != generation).then(|| {
        format!("status outdated: observedGeneration {observed} != generation {generation}")
    })
}

/// A failed check that says nothing yet: what it reads has not been written for the current generation.
fn not_reported_yet(check: &CompiledCheck, object: &Value) -> bool {
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    match check {
        CompiledCheck::Condition { type_, .. } => {
            let condition = object
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
                });
            match condition {
                None => true,
                Some(c) => {
                    let observed = c.get("observedGeneration").and_then(Value::as_i64);
                    observed.is_some() && generation.is_some() && observed != generation
                }
            }
        }
        // A missing status field is the controller's to write; any other missing field is a failure.
        CompiledCheck::FieldsEqual { field_a, field_b } => [field_a, field_b].iter().any(|f| {
            f.trim_start_matches('.').starts_with("status.") && field_at(object, f).is_none()
        }),
        CompiledCheck::Cel { .. } => false,
    }
}

fn run_check(check: &CompiledCheck, object: &Value) -> Result<(), String> {
    match check {
        CompiledCheck::Condition { type_, status } => probe_condition(object, type_, status),
        CompiledCheck::FieldsEqual { field_a, field_b } => {
            probe_fields_equal(object, field_a, field_b)
        }
        CompiledCheck::Cel { program, message } => probe_cel(object, program, message),
    }
}

/// `condition` probe: the object reports condition `type_` with `status`, written for its current generation.
pub fn probe_condition(object: &Value, type_: &str, status: &str) -> Result<(), String> {
    let conditions = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("missing .status.conditions (want {type_}={status})"))?;
    let condition = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .ok_or_else(|| format!("missing condition {type_:?}"))?;
    if let (Some(observed), Some(generation)) = (
        condition.get("observedGeneration").and_then(Value::as_i64),
        object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64),
    ) {
        if observed != generation {
            return Err(format!(
                "condition {type_:?} is outdated: observedGeneration {observed} != generation {generation}"
            ));
        }
    }
    let actual = condition
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("");
    if actual == status {
        Ok(())
    } else {
        Err(format!(
            "condition {type_:?} is {actual:?}, want {status:?}"
        ))
    }
}

/// Resolves a dotted path (`.spec.replicas` or `spec.replicas`) in a JSON object.
pub fn field_at<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .try_fold(object, |v, segment| v.get(segment))
}

/// `fieldsEqual` probe: both fields exist and hold equal values.
pub fn probe_fields_equal(object: &Value, field_a: &str, field_b: &str) -> Result<(), String> {
    let a = field_at(object, field_a).ok_or_else(|| format!("field {field_a:?} is missing"))?;
    let b = field_at(object, field_b).ok_or_else(|| format!("field {field_b:?} is missing"))?;
    if json_numbers_equal(a, b) || a == b {
        Ok(())
    } else {
        Err(format!("{field_a:?} == {field_b:?}: {a} != {b}"))
    }
}

fn json_numbers_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => a.is_number() && b.is_number() && x == y,
        _ => false,
    }
}

/// `cel` probe: `rule` evaluated with the object as `self` is `true`.
fn probe_cel(object: &Value, program: &CelRule, message: &str) -> Result<(), String> {
    match evaluate_cel(program, object) {
        Ok(true) => Ok(()),
        Ok(false) => Err(message.to_owned()),
        Err(e) => Err(format!("{message} (CEL error: {e})")),
    }
}

/// Evaluates a compiled boolean CEL expression with `object` bound to `self`.
pub fn evaluate_cel(program: &CelRule, object: &Value) -> Result<bool, String> {
    evaluate_cel_with(program, [("self", object)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::core::common::{PackageProbeKindSpec, ProbeCelSpec, ProbeConditionSpec};
    use proptest::prelude::*;
    use serde_json::json;

    fn key(group: &str, kind: &str) -> ObjectKey {
        ObjectKey {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: "x".into(),
        }
    }

    fn group(kind: &str, probes: Vec<Probe>) -> ObjectSetProbe {
        ObjectSetProbe {
            probes,
            selector: ProbeSelector {
                kind: PackageProbeKindSpec {
                    group: "apps".into(),
                    kind: kind.into(),
                },
                selector: None,
            },
        }
    }

    fn cel(rule: &str) -> Probe {
        Probe {
            cel: Some(ProbeCelSpec {
                rule: rule.into(),
                message: "rule failed".into(),
            }),
            ..Default::default()
        }
    }

    fn condition(t: &str) -> Probe {
        Probe {
            condition: Some(ProbeConditionSpec {
                type_: t.into(),
                status: "True".into(),
            }),
            ..Default::default()
        }
    }

    fn deployment(replicas: i64, updated: i64, generation: i64, observed: i64) -> Value {
        json!({
            "metadata": {"generation": generation, "labels": {"app": "a"}},
            "spec": {"replicas": replicas},
            "status": {
                "observedGeneration": observed,
                "updatedReplicas": updated,
                "conditions": [{"type": "Available", "status": "True"}],
            }
        })
    }

    #[test]
    fn cel_sees_integers_as_int() {
        let set = ProbeSet::compile(
            &[group(
                "Deployment",
                vec![cel(
                    "self.spec.replicas == 3 && self.status.updatedReplicas >= 3",
                )],
            )],
            "spec.availabilityProbes",
        )
        .unwrap();
        let k = key("apps", "Deployment");
        assert_eq!(
            set.evaluate(&k, &deployment(3, 3, 1, 1)),
            ProbeResult::Passed
        );
        assert_eq!(
            set.evaluate(&k, &deployment(3, 2, 1, 1)),
            ProbeResult::Failed(vec!["rule failed".into()])
        );
    }

    #[test]
    fn kubernetes_cel_libraries_are_available() {
        let set = ProbeSet::compile(
            &[group(
                "Deployment",
                vec![cel("self.metadata.labels.app.upperAscii() == 'A'")],
            )],
            "p",
        )
        .unwrap();
        assert!(set
            .evaluate(&key("apps", "Deployment"), &deployment(1, 1, 1, 1))
            .passed());
    }

    #[test]
    fn invalid_cel_names_the_field() {
        let err = ProbeSet::compile(
            &[group(
                "Deployment",
                vec![condition("A"), cel("self.spec.(")],
            )],
            "spec.availabilityProbes",
        )
        .unwrap_err();
        match err {
            ProbeSpecError::InvalidCel { field, .. } => {
                assert_eq!(field, "spec.availabilityProbes[0].probes[1].cel.rule")
            }
            other => panic!("unexpected {other:?}"),
        }
        // Over the CEL budget: refused when compiled, the limit named with the field.
        let costly = "self.a.all(x, self.a.all(y, self.a.all(z, x == z)))";
        let err = ProbeSet::compile(&[group("Deployment", vec![cel(costly)])], "p").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("p[0].probes[0].cel.rule: invalid CEL rule {costly:?}: comprehensions (all, exists, map, filter) nest 3 deep, more than the limit of 2")
        );
        // Within it at compile time, but over the step budget for this object: a failed probe.
        let pairs = ProbeSet::compile(
            &[group(
                "Deployment",
                vec![cel("self.spec.a.all(x, self.spec.a.exists(y, x == y))")],
            )],
            "p",
        )
        .unwrap();
        assert!(pairs.has_cel());
        let wide = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "generation": 1}, "spec": {"a": (0..2000).collect::<Vec<_>>()},
            "status": {"observedGeneration": 1}});
        match pairs.evaluate(&key("apps", "Deployment"), &wide) {
            ProbeResult::Failed(messages) => {
                assert!(
                    messages[0].contains("over the evaluation budget"),
                    "{messages:?}"
                )
            }
            other => panic!("unexpected {other:?}"),
        }
        let err =
            ProbeSet::compile(&[group("Deployment", vec![Probe::default()])], "p").unwrap_err();
        assert_eq!(
            err,
            ProbeSpecError::AmbiguousProbe {
                field: "p[0].probes[0]".into()
            }
        );
    }

    #[test]
    fn stale_status_fails_and_unselected_objects_pass() {
        let set =
            ProbeSet::compile(&[group("Deployment", vec![condition("Available")])], "p").unwrap();
        let k = key("apps", "Deployment");
        assert!(set.evaluate(&k, &deployment(1, 1, 2, 2)).passed());
        // Not reported for the current generation yet: pending, not failed.
        let stale = set.evaluate(&k, &deployment(1, 1, 3, 2));
        assert!(
            matches!(&stale, ProbeResult::Pending(m) if m[0].contains("outdated")),
            "{stale:?}"
        );
        assert!(set.evaluate(&key("", "ConfigMap"), &json!({})).passed());
    }

    #[test]
    fn status_not_written_yet_is_pending_and_a_contradicting_one_fails() {
        let set = ProbeSet::compile(
            &[group(
                "Deployment",
                vec![
                    condition("Available"),
                    serde_json::from_value(json!({"fieldsEqual": {
                        "fieldA": ".status.updatedReplicas", "fieldB": ".status.replicas"}}))
                    .unwrap(),
                ],
            )],
            "p",
        )
        .unwrap();
        let k = key("apps", "Deployment");
        let fresh = json!({"metadata": {"generation": 2}, "spec": {}});
        assert!(matches!(set.evaluate(&k, &fresh), ProbeResult::Pending(_)));
        let outdated_condition = json!({"metadata": {"generation": 2}, "status": {
            "replicas": 1, "updatedReplicas": 1,
            "conditions": [{"type": "Available", "status": "True", "observedGeneration": 1}]}});
        assert!(matches!(
            set.evaluate(&k, &outdated_condition),
            ProbeResult::Pending(_)
        ));
        // Written for this generation, and it says no: failed, even beside a pending check.
        let rolling = json!({"metadata": {"generation": 2}, "status": {
            "observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
            "conditions": [{"type": "Available", "status": "True"}]}});
        assert!(
            matches!(set.evaluate(&k, &rolling), ProbeResult::Failed(m) if m[0].contains("1 != 2"))
        );
        let data = ProbeSet::compile(
            &[group(
                "Deployment",
                vec![serde_json::from_value(
                    json!({"fieldsEqual": {"fieldA": ".data.ready", "fieldB": ".data.want"}}),
                )
                .unwrap()],
            )],
            "p",
        )
        .unwrap();
        let no_data = json!({"metadata": {"generation": 2}, "data": {"want": "yes"}});
        assert!(
            matches!(data.evaluate(&k, &no_data), ProbeResult::Failed(_)),
            "only status is a controller's to write"
        );
        let down = json!({"metadata": {"generation": 2}, "status": {
            "conditions": [{"type": "Available", "status": "False", "observedGeneration": 2}]}});
        assert!(matches!(set.evaluate(&k, &down), ProbeResult::Failed(_)));
    }

    #[test]
    fn condition_and_fields_equal_messages() {
        let obj = json!({"metadata": {"generation": 1}, "spec": {"a": 1}, "status": {"b": 1.0, "c": "x",
            "conditions": [{"type": "Ready", "status": "False", "observedGeneration": 1}]}});
        assert_eq!(probe_fields_equal(&obj, ".spec.a", ".status.b"), Ok(()));
        assert!(probe_fields_equal(&obj, ".spec.a", ".status.c")
            .unwrap_err()
            .contains("!="));
        assert!(probe_fields_equal(&obj, "spec.missing", "status.c")
            .unwrap_err()
            .contains("missing"));
        assert_eq!(probe_condition(&obj, "Ready", "False"), Ok(()));
        assert!(probe_condition(&obj, "Ready", "True")
            .unwrap_err()
            .contains("\"False\""));
        assert!(probe_condition(&obj, "Gone", "True")
            .unwrap_err()
            .contains("missing condition"));
    }

    proptest! {
        /// fieldsEqual is symmetric.
        #[test]
        fn fields_equal_is_symmetric(a in any::<i32>(), b in any::<i32>()) {
            let obj = json!({"spec": {"a": a, "b": b}});
            prop_assert_eq!(probe_fields_equal(&obj, "spec.a", "spec.b").is_ok(), probe_fields_equal(&obj, "spec.b", "spec.a").is_ok());
            prop_assert_eq!(probe_fields_equal(&obj, "spec.a", "spec.b").is_ok(), a == b);
        }
    }
}
