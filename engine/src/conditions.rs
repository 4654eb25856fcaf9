//! Status-condition bookkeeping shared by every kind pko reports on: set a condition keeping its
//! `lastTransitionTime` when the status did not change, remove one, look one up.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api_time::whole_seconds;

/// The content of a condition; time and generation are filled in by [`set_condition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl ConditionUpdate {
    pub fn new(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

fn status_str(status: bool) -> &'static str {
    if status {
        "True"
    } else {
        "False"
    }
}

/// Sets (adds or replaces) a condition. `lastTransitionTime` moves only when the status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    update: ConditionUpdate,
    generation: i64,
    now: Timestamp,
) {
    let status = status_str(update.status);
    let existing = conditions.iter_mut().find(|c| c.type_ == update.type_);
    let transition = match &existing {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        // The API keeps whole seconds; a finer time would differ from its own echo.
        _ => Time(whole_seconds(now)),
    };
    let condition = Condition {
        type_: update.type_,
        status: status.to_owned(),
        reason: update.reason,
        message: update.message,
        observed_generation: Some(generation),
        last_transition_time: transition,
    };
    match existing {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

/// `text` cut to at most `max_bytes` at a character boundary, ending in `…` when cut: for text that others
/// wrote (a condition's message, an Event's note) where it must fit a bound.
pub fn bounded_text(mut text: String, max_bytes: usize) -> String {
    if text.len() > max_bytes {
        let mut cut = max_bytes.saturating_sub('…'.len_utf8());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// The most a hosted cluster's own text (a connector's report or dry-run verdict) keeps.
pub const FOREIGN_TEXT_LIMIT: usize = 1024;

/// Text another party wrote (a connector, a hosted cluster's apiserver or webhooks) as the manager
/// passes it on into conditions, Events, reports and the fleet: control characters (terminal escapes,
/// line breaks that fake further lines) become spaces, and it is cut to [`FOREIGN_TEXT_LIMIT`] bytes.
pub fn foreign_text(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    bounded_text(cleaned, FOREIGN_TEXT_LIMIT)
}

/// Whether a condition type is a mapped one (`domain/Type`, copied from an object's own conditions
/// through a phase's conditionMappings).
pub fn is_mapped(type_: &str) -> bool {
    type_.contains('/')
}

/// Mirrors another object's conditions into `conditions`: of the types `mirrored` selects, those
/// `source` no longer reports are dropped and the others updated in place, so their
/// `lastTransitionTime` moves only when their status does (dropping and re-adding them would stamp a new
/// time, and a status write, on every reconcile). How Packages follow their ObjectDeployment and
/// ObjectDeployments follow their current revision.
pub fn mirror_conditions<'a>(
    conditions: &mut Vec<Condition>,
    source: impl IntoIterator<Item = &'a Condition>,
    mirrored: impl Fn(&str) -> bool,
    generation: i64,
    now: Timestamp,
) {
    let source: Vec<&Condition> = source.into_iter().filter(|c| mirrored(&c.type_)).collect();
    conditions.retain(|c| !mirrored(&c.type_) || source.iter().any(|s| s.type_ == c.type_));
    for c in source {
        let update =
            ConditionUpdate::new(&c.type_, c.status == "True", &c.reason, c.message.clone());
        set_condition(conditions, update, generation, now);
    }
}

/// Removes a condition if present.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// The condition of this type, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition was written for `generation` (one without `observedGeneration` counts as
/// current).
pub fn is_current(condition: &Condition, generation: i64) -> bool {
    condition
        .observed_generation
        .is_none_or(|g| g == generation)
}

/// Whether any condition was written for `generation`: the object has reported on its current spec.
pub fn reported_for(conditions: &[Condition], generation: i64) -> bool {
    conditions.iter().any(|c| is_current(c, generation))
}

/// True when the condition is present, `True`, and written for `generation`.
pub fn is_true_for(conditions: &[Condition], type_: &str, generation: i64) -> bool {
    find_condition(conditions, type_)
        .is_some_and(|c| c.status == "True" && is_current(c, generation))
}

/// An object's condition of this type, read from its JSON, unless it was written for another generation
/// than the object's current one (one without `observedGeneration` counts as current, as in
/// [`is_true_for`]).
pub fn current_condition<'a>(
    object: &'a serde_json::Value,
    type_: &str,
) -> Option<&'a serde_json::Value> {
    use serde_json::Value;
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let condition = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?;
    let observed = condition.get("observedGeneration").and_then(Value::as_i64);
    match (observed, generation) {
        (Some(o), Some(g)) if o != g => None,
        _ => Some(condition),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_for_another_generation_is_not_current() {
        let object = serde_json::json!({"metadata": {"generation": 2}, "status": {"conditions": [
            {"type": "Available", "observedGeneration": 2},
            {"type": "Ready", "observedGeneration": 1},
            {"type": "Mapped"}]}});
        assert!(current_condition(&object, "Available").is_some());
        assert!(current_condition(&object, "Ready").is_none());
        assert!(current_condition(&object, "Mapped").is_some());
        assert!(current_condition(&object, "Missing").is_none());
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            ConditionUpdate::new("Available", false, "A", "x"),
            1,
            t0,
        );
        set_condition(
            &mut conds,
            ConditionUpdate::new("Available", false, "B", "y"),
            2,
            t1,
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time.0, t0);
        assert_eq!(conds[0].reason, "B");
        assert_eq!(conds[0].observed_generation, Some(2));
        set_condition(
            &mut conds,
            ConditionUpdate::new("Available", true, "C", "z"),
            2,
            t1,
        );
        assert_eq!(conds[0].last_transition_time.0, t1);
        assert!(is_true_for(&conds, "Available", 2));
        assert!(!is_true_for(&conds, "Available", 3));
        remove_condition(&mut conds, "Available");
        assert!(conds.is_empty());
    }

    #[test]
    fn foreign_text_has_no_control_characters_and_a_bound() {
        assert_eq!(
            foreign_text("refused\n\u{1b}[2J\u{1b}[31mApproved: yes\r"),
            "refused  [2J [31mApproved: yes "
        );
        let long = foreign_text(&"é".repeat(2_000));
        assert!(long.len() <= FOREIGN_TEXT_LIMIT && long.ends_with('…'));
        assert_eq!(foreign_text("fine"), "fine");
    }
}
