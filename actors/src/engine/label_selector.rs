//! Kubernetes label-selector matching (`matchLabels` and `matchExpressions`) over plain label maps.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector the apiserver would also reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("matchExpressions[{index}]: unknown operator {operator:?} (want In, NotIn, Exists or DoesNotExist)")]
    UnknownOperator { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} needs at least one value")]
    MissingValues { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} takes no values")]
    UnexpectedValues { index: usize, operator: String },
}

/// True when `labels` satisfy every requirement of `selector`; an empty selector matches everything.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut matches = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let values = expr.values.as_deref().unwrap_or_default();
        let value = labels.get(&expr.key);
        let ok = match expr.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError::MissingValues {
                    index,
                    operator: expr.operator.clone(),
                })
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError::UnexpectedValues {
                    index,
                    operator: expr.operator.clone(),
                })
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(SelectorError::UnknownOperator {
                    index,
                    operator: other.to_owned(),
                })
            }
        };
        matches &= ok;
    }
    Ok(matches)
}

/// Renders a selector's `matchLabels` as the `key=value,...` form list/watch calls take. Expressions are
/// evaluated client-side with [`selector_matches`].
pub fn match_labels_query(selector: &LabelSelector) -> String {
    selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert_eq!(
            selector_matches(&LabelSelector::default(), &labels(&[])),
            Ok(true)
        );
    }

    #[test]
    fn match_labels_and_expressions_combine() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_owned(), "a".to_owned())].into()),
            match_expressions: Some(vec![
                expr("tier", "In", &["web", "db"]),
                expr("legacy", "DoesNotExist", &[]),
            ]),
        };
        assert_eq!(
            selector_matches(&sel, &labels(&[("app", "a"), ("tier", "db")])),
            Ok(true)
        );
        assert_eq!(
            selector_matches(&sel, &labels(&[("app", "a"), ("tier", "x")])),
            Ok(false)
        );
        assert_eq!(
            selector_matches(
                &sel,
                &labels(&[("app", "a"), ("tier", "web"), ("legacy", "")])
            ),
            Ok(false)
        );
    }

    #[test]
    fn malformed_expressions_are_errors() {
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("k", "Within", &["x"])]),
            ..Default::default()
        };
        assert!(matches!(
            selector_matches(&sel, &labels(&[])),
            Err(SelectorError::UnknownOperator { index: 0, .. })
        ));
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("k", "In", &[])]),
            ..Default::default()
        };
        assert!(selector_matches(&sel, &labels(&[])).is_err());
    }
}
