//! A HostedClusterPackage's rollout policy (pko extension `spec.rolloutPolicy`, and the percentage form of
//! `maxUnavailable`) checked and turned into plain settings: durations, budgets, per-group rules. Errors
//! name the field and what is wrong. What the settings do to a rollout is `engine::rollout::rollout_guard`'s.
//!
//! Pure: no I/O, no clock.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackageGroupPolicy, HostedClusterPackageHealthCheck, HostedClusterPackageRollback,
    HostedClusterPackageRolloutPolicy,
};

use crate::rollout::rollout_plan::UNKNOWN_GROUP;

/// The longest duration a policy takes (a soak or deadline longer than a month is a typo).
const MAX_DURATION: Duration = Duration::from_secs(31 * 24 * 60 * 60);

/// Go-style durations as kubectl and Kubernetes APIs write them: `90s`, `5m`, `1h30m`, `500ms`; `0` is
/// zero. `None` when the text is not one.
pub fn parse_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value.checked_mul(60)?),
            "h" => Duration::from_secs(value.checked_mul(3600)?),
            _ => return None,
        };
        total = total.checked_add(part)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// A count given as a number or as a percentage of a total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Count(usize),
    /// Percent, 0..=100.
    Percent(u32),
}

impl Budget {
    /// The count for `total` items: a percentage rounds down.
    pub fn of(self, total: usize) -> usize {
        match self {
            Budget::Count(n) => n,
            Budget::Percent(p) => total.saturating_mul(p as usize) / 100,
        }
    }
}

/// Reads `value` of `field` as a non-negative count or a percentage `N%` with N in 0..=100.
pub fn budget(value: &IntOrString, field: &str) -> Result<Budget, String> {
    match value {
        IntOrString::Int(n) => usize::try_from(*n)
            .map(Budget::Count)
            .map_err(|_| format!("{field}: must not be negative, got {n}")),
        IntOrString::String(text) => text
            .strip_suffix('%')
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|p| *p <= 100)
            .map(Budget::Percent)
            .ok_or_else(|| {
                format!("{field}: want a number or a percentage such as \"25%\", got {text:?}")
            }),
    }
}

/// `maxUnavailable` for `total` selected Packages: a number (at least 1), or a percentage rounded down
/// and at least 1, as a Deployment's.
pub fn max_unavailable(budget: Budget, total: usize) -> usize {
    budget.of(total).max(1)
}

/// A health check as the guard evaluates it.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    pub name: String,
    pub query: String,
    pub max: Option<f64>,
    pub min: Option<f64>,
}

/// The settings of one group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupPolicy {
    pub min_success_time: Duration,
    pub progress_deadline: Option<Duration>,
    /// `None`: failures never halt; they keep their group unfinished until they recover.
    pub max_failures: Option<Budget>,
    pub require_approval: bool,
    pub health_checks: Vec<HealthCheck>,
}

/// The rollout policy of a HostedClusterPackage.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RolloutPolicy {
    pub defaults: GroupPolicy,
    /// Groups with settings of their own (defaults merged in), by name (`unknown` for the unknown
    /// group).
    pub groups: BTreeMap<String, GroupPolicy>,
    pub automatic_rollback: bool,
}

impl RolloutPolicy {
    /// The settings of group `name` (`None`: the unknown group).
    pub fn group(&self, name: Option<&str>) -> &GroupPolicy {
        self.groups
            .get(name.unwrap_or(UNKNOWN_GROUP))
            .unwrap_or(&self.defaults)
    }
}

/// A duration of the policy (`field` names it in errors): at most [`MAX_DURATION`]; `None` when unset.
pub(crate) fn duration(value: Option<&String>, field: &str) -> Result<Option<Duration>, String> {
    let Some(text) = value else {
        return Ok(None);
    };
    match parse_duration(text) {
        Some(d) if d <= MAX_DURATION => Ok(Some(d)),
        Some(_) => Err(format!("{field}: at most 744h (31 days), got {text:?}")),
        None => Err(format!(
            "{field}: want a duration such as 90s, 10m or 1h30m, got {text:?}"
        )),
    }
}

fn health_checks(
    checks: &[HostedClusterPackageHealthCheck],
    field: &str,
) -> Result<Vec<HealthCheck>, String> {
    let mut seen = std::collections::BTreeSet::new();
    checks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let at = format!("{field}[{i}]");
            if c.name.is_empty() {
                return Err(format!("{at}.name: must not be empty"));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(format!("{at}.name: {:?} is used twice", c.name));
            }
            if c.query.trim().is_empty() {
                return Err(format!("{at}.query: must not be empty"));
            }
            if c.max.is_none() && c.min.is_none() {
                return Err(format!("{at}: set max, min or both"));
            }
            if let (Some(min), Some(max)) = (c.min, c.max) {
                if min > max {
                    return Err(format!("{at}: min {min} is above max {max}"));
                }
            }
            if c.max.is_some_and(|v| !v.is_finite()) || c.min.is_some_and(|v| !v.is_finite()) {
                return Err(format!("{at}: bounds must be finite numbers"));
            }
            Ok(HealthCheck {
                name: c.name.clone(),
                query: c.query.clone(),
                max: c.max,
                min: c.min,
            })
        })
        .collect()
}

/// `spec` over `base`: a field `spec` sets replaces `base`'s.
fn group_policy(
    spec: &HostedClusterPackageGroupPolicy,
    base: &GroupPolicy,
    field: &str,
) -> Result<GroupPolicy, String> {
    Ok(GroupPolicy {
        min_success_time: duration(
            spec.min_success_time.as_ref(),
            &format!("{field}.minSuccessTime"),
        )?
        .unwrap_or(base.min_success_time),
        progress_deadline: match duration(
            spec.progress_deadline.as_ref(),
            &format!("{field}.progressDeadline"),
        )? {
            Some(d) if d.is_zero() => {
                return Err(format!("{field}.progressDeadline: must be more than 0"))
            }
            Some(d) => Some(d),
            None => base.progress_deadline,
        },
        max_failures: match &spec.max_failures {
            Some(v) => Some(budget(v, &format!("{field}.maxFailures"))?),
            None => base.max_failures,
        },
        require_approval: spec.require_approval.unwrap_or(base.require_approval),
        health_checks: match &spec.health_checks {
            Some(checks) => health_checks(checks, &format!("{field}.healthChecks"))?,
            None => base.health_checks.clone(),
        },
    })
}

/// Checks `spec.rolloutPolicy`; `None` is the empty policy (every existing HostedClusterPackage).
pub fn rollout_policy(
    spec: Option<&HostedClusterPackageRolloutPolicy>,
) -> Result<RolloutPolicy, String> {
    let Some(spec) = spec else {
        return Ok(RolloutPolicy::default());
    };
    let field = "spec.rolloutPolicy";
    let defaults = group_policy(
        &spec.defaults,
        &GroupPolicy::default(),
        &format!("{field}.defaults"),
    )?;
    let mut groups = BTreeMap::new();
    for (i, g) in spec.groups.iter().enumerate() {
        let at = format!("{field}.groups[{i}]");
        if g.name.is_empty() {
            return Err(format!("{at}.name: must not be empty"));
        }
        let policy = group_policy(&g.policy, &defaults, &at)?;
        if groups.insert(g.name.clone(), policy).is_some() {
            return Err(format!("{at}.name: {:?} is listed twice", g.name));
        }
    }
    Ok(RolloutPolicy {
        defaults,
        groups,
        automatic_rollback: spec.rollback == HostedClusterPackageRollback::Automatic,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::core::hosted_cluster_package::HostedClusterPackageRolloutPolicy;
    use proptest::prelude::*;
    use serde_json::json;

    fn policy(value: serde_json::Value) -> Result<RolloutPolicy, String> {
        let spec: HostedClusterPackageRolloutPolicy = serde_json::from_value(value).unwrap();
        rollout_policy(Some(&spec))
    }

    #[test]
    fn durations_read_like_go() {
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        for bad in ["", "5", "m", "5x", "1.5h", "-1s", "99999999999999999999h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn percentages_round_down_and_max_unavailable_is_at_least_one() {
        let b = |v: IntOrString| budget(&v, "f").unwrap();
        assert_eq!(b(IntOrString::String("25%".into())).of(10), 2);
        assert_eq!(max_unavailable(b(IntOrString::String("5%".into())), 10), 1);
        assert_eq!(max_unavailable(b(IntOrString::Int(3)), 10), 3);
        assert_eq!(b(IntOrString::String("0%".into())).of(10), 0);
        assert_eq!(
            budget(&IntOrString::String("150%".into()), "spec.x").unwrap_err(),
            "spec.x: want a number or a percentage such as \"25%\", got \"150%\""
        );
        assert_eq!(
            budget(&IntOrString::Int(-1), "spec.x").unwrap_err(),
            "spec.x: must not be negative, got -1"
        );
    }

    #[test]
    fn groups_take_the_defaults_and_replace_what_they_set() {
        let p = policy(json!({
            "defaults": {"minSuccessTime": "5m", "maxFailures": "10%", "progressDeadline": "10m"},
            "groups": [{"name": "prod", "requireApproval": true, "minSuccessTime": "1h",
                        "healthChecks": [{"name": "errors", "query": "up", "min": 1}]}],
            "rollback": "Automatic",
        }))
        .unwrap();
        assert!(p.automatic_rollback);
        let prod = p.group(Some("prod"));
        assert_eq!(prod.min_success_time, Duration::from_secs(3600));
        assert_eq!(prod.progress_deadline, Some(Duration::from_secs(600)));
        assert_eq!(prod.max_failures, Some(Budget::Percent(10)));
        assert!(prod.require_approval);
        assert_eq!(prod.health_checks[0].min, Some(1.0));
        let other = p.group(None);
        assert_eq!(other.min_success_time, Duration::from_secs(300));
        assert!(!other.require_approval);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let cases = [
            (
                json!({"defaults": {"minSuccessTime": "soon"}}),
                "spec.rolloutPolicy.defaults.minSuccessTime: want a duration such as 90s, 10m or 1h30m, got \"soon\"",
            ),
            (
                json!({"defaults": {"progressDeadline": "0"}}),
                "spec.rolloutPolicy.defaults.progressDeadline: must be more than 0",
            ),
            (
                json!({"groups": [{"name": "a", "maxFailures": "x%"}]}),
                "spec.rolloutPolicy.groups[0].maxFailures: want a number or a percentage such as \"25%\", got \"x%\"",
            ),
            (
                json!({"groups": [{"name": "a"}, {"name": "a"}]}),
                "spec.rolloutPolicy.groups[1].name: \"a\" is listed twice",
            ),
            (
                json!({"defaults": {"healthChecks": [{"name": "e", "query": "up"}]}}),
                "spec.rolloutPolicy.defaults.healthChecks[0]: set max, min or both",
            ),
            (
                json!({"defaults": {"minSuccessTime": "800h"}}),
                "spec.rolloutPolicy.defaults.minSuccessTime: at most 744h (31 days), got \"800h\"",
            ),
        ];
        for (value, want) in cases {
            assert_eq!(policy(value).unwrap_err(), want);
        }
    }

    proptest! {
        /// A percentage budget never exceeds its total and maxUnavailable is always at least one.
        #[test]
        fn budgets_stay_within_their_total(p in 0u32..=100, total in 0usize..10_000) {
            let b = Budget::Percent(p);
            prop_assert!(b.of(total) <= total);
            prop_assert!(max_unavailable(b, total) >= 1);
        }
    }
}
