//! Kubernetes label-selector matching (`matchLabels` and `matchExpressions`) over plain label maps:
//! kube's `Selector` matches, this module validates with errors naming the expression.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

/// A selector the apiserver would also reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("matchExpressions[{index}]: unknown operator {operator:?} (want In, NotIn, Exists or DoesNotExist)")]
    UnknownOperator { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} needs at least one value")]
    MissingValues { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} takes no values")]
    UnexpectedValues { index: usize, operator: String },
    #[error("{0}")]
    Unparsable(String),
}

/// True when `labels` satisfy every requirement of `selector`; an empty selector matches everything.
/// Matching is kube's [`Selector`]; the validation before it is ours, because kube's conversion accepts
/// selectors the apiserver rejects (`In` with an empty list, `Exists` with values) and its errors do not
/// say which expression is wrong.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let has_values = expr.values.as_ref().is_some_and(|v| !v.is_empty());
        let operator = || expr.operator.clone();
        match expr.operator.as_str() {
            "In" | "NotIn" if !has_values => {
                return Err(SelectorError::MissingValues {
                    index,
                    operator: operator(),
                })
            }
            "Exists" | "DoesNotExist" if has_values => {
                return Err(SelectorError::UnexpectedValues {
                    index,
                    operator: operator(),
                })
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => {
                return Err(SelectorError::UnknownOperator {
                    index,
                    operator: operator(),
                })
            }
        }
    }
    let parsed =
        Selector::try_from(selector.clone()).map_err(|e| SelectorError::Unparsable(e.0))?;
    Ok(parsed.matches(labels))
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
        // What kube's own conversion lets through, the apiserver refuses; so do we.
        let empty_list = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "NotIn".into(),
                values: Some(vec![]),
            }]),
            ..Default::default()
        };
        assert!(matches!(
            selector_matches(&empty_list, &labels(&[])),
            Err(SelectorError::MissingValues { index: 0, .. })
        ));
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("k", "Exists", &["x"])]),
            ..Default::default()
        };
        assert_eq!(
            selector_matches(&sel, &labels(&[]))
                .unwrap_err()
                .to_string(),
            "matchExpressions[0]: operator Exists takes no values"
        );
    }
}
