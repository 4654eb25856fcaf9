//! Conditional filtering: which files and objects of a package are rendered for a given template context.
//! Named CEL conditions (`cond.<name>`) are evaluated once; a conditional path drops every file its glob
//! matches when its expression is false; an object's `package-operator.run/condition` annotation drops
//! that object when false. Every expression sees the context's top-level keys (`config`, `package`,
//! `environment`, ...) and `cond`.

use pko_proto::well_known::CONDITION_ANNOTATION;
use std::collections::BTreeMap;

use pko_proto::manifests::PackageManifestConditionalFiltering;
use serde_json::Value;

use super::template_funcs::glob_match;
use crate::cel::{compile_bounded, evaluate_cel_with};

/// Evaluates the filtering section once for a context.
#[derive(Debug, Clone)]
pub struct Filter {
    variables: BTreeMap<String, Value>,
    /// (glob, expression, result)
    paths: Vec<(String, bool)>,
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn evaluate(expression: &str, variables: &BTreeMap<String, Value>) -> Result<bool, String> {
    let program =
        compile_bounded(expression).map_err(|e| format!("invalid CEL {expression:?}: {e}"))?;
    evaluate_cel_with(&program, variables.iter().map(|(k, v)| (k.as_str(), v)))
        .map_err(|e| format!("CEL {expression:?}: {e}"))
}

impl Filter {
    /// Evaluates named conditions and path conditions; errors name the manifest field.
    pub fn new(
        filtering: Option<&PackageManifestConditionalFiltering>,
        context: &Value,
    ) -> Result<Self, String> {
        let mut variables: BTreeMap<String, Value> = context
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let mut cond = serde_json::Map::new();
        variables.insert("cond".to_owned(), Value::Object(cond.clone()));
        let Some(filtering) = filtering else {
            return Ok(Self {
                variables,
                paths: Vec::new(),
            });
        };
        for (i, named) in filtering.named_conditions.iter().enumerate() {
            let field = format!("spec.conditionalFiltering.namedConditions[{i}]");
            if !is_identifier(&named.name) {
                return Err(format!(
                    "{field}.name: {:?} is not a CEL identifier ([_a-zA-Z][_a-zA-Z0-9]*)",
                    named.name
                ));
            }
            let result = evaluate(&named.expression, &variables)
                .map_err(|e| format!("{field}.expression: {e}"))?;
            cond.insert(named.name.clone(), Value::Bool(result));
            variables.insert("cond".to_owned(), Value::Object(cond.clone()));
        }
        let paths = filtering
            .conditional_paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                evaluate(&p.expression, &variables)
                    .map(|keep| (p.glob.clone(), keep))
                    .map_err(|e| {
                        format!("spec.conditionalFiltering.conditionalPaths[{i}].expression: {e}")
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { variables, paths })
    }

    /// False when a conditional path matching `path` evaluated to false.
    pub fn keeps_path(&self, path: &str) -> bool {
        self.paths
            .iter()
            .all(|(glob, keep)| *keep || !glob_match(glob, path))
    }

    /// Whether an object's own condition annotation (if any) holds.
    pub fn keeps_object(&self, object: &Value) -> Result<bool, String> {
        match object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(CONDITION_ANNOTATION))
            .and_then(Value::as_str)
        {
            None => Ok(true),
            Some(expression) => evaluate(expression, &self.variables),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filtering(value: Value) -> PackageManifestConditionalFiltering {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn named_conditions_feed_paths_and_objects() {
        let f = filtering(json!({
            "namedConditions": [{"name": "isHA", "expression": "config.replicas > 1"}],
            "conditionalPaths": [{"glob": "ha/**", "expression": "cond.isHA"}],
        }));
        let single = Filter::new(Some(&f), &json!({"config": {"replicas": 1}})).unwrap();
        assert!(!single.keeps_path("ha/pdb.yaml"));
        assert!(single.keeps_path("deploy.yaml"));
        let ha = Filter::new(Some(&f), &json!({"config": {"replicas": 3}})).unwrap();
        assert!(ha.keeps_path("ha/pdb.yaml"));
        let object = json!({"metadata": {"annotations": {CONDITION_ANNOTATION: "!cond.isHA"}}});
        assert_eq!(single.keeps_object(&object), Ok(true));
        assert_eq!(ha.keeps_object(&object), Ok(false));
        assert_eq!(ha.keeps_object(&json!({"metadata": {}})), Ok(true));
    }

    #[test]
    fn the_older_spelling_is_accepted_and_errors_name_the_field() {
        let f = filtering(json!({"conditions": [{"name": "1bad", "expression": "true"}]}));
        let err = Filter::new(Some(&f), &json!({})).unwrap_err();
        assert!(
            err.starts_with("spec.conditionalFiltering.namedConditions[0].name"),
            "{err}"
        );
        let f = filtering(json!({"paths": [{"glob": "*", "expression": "config.("}]}));
        let err = Filter::new(Some(&f), &json!({"config": {}})).unwrap_err();
        assert!(
            err.starts_with(
                "spec.conditionalFiltering.conditionalPaths[0].expression: invalid CEL"
            ),
            "{err}"
        );
    }
}
