//! `*.gotmpl` rendering: Go text/template semantics (the gotmpl crate) with `missingkey=error`, the
//! functions of `template_funcs.rs`, and the package's `_`-prefixed helper files, whose `define`d templates
//! every template can call with `{{ template "name" . }}`. Errors name the file.

use gotmpl::{FuncMap, MissingKey, Template};
use serde_json::Value;

/// A template that failed to parse or render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct TemplateError {
    pub file: String,
    pub message: String,
}

/// Renders `source` (from `file`) with `context` as `.` and `funcs` callable; `helpers` are (file,
/// source) pairs whose `define`d templates become callable.
pub fn render(
    file: &str,
    source: &str,
    helpers: &[(String, String)],
    funcs: &FuncMap,
    context: &Value,
) -> Result<String, TemplateError> {
    let err = |message: String| TemplateError {
        file: file.to_owned(),
        message,
    };
    let data = gotmpl::ser::to_value(context).map_err(|e| err(e.to_string()))?;
    let mut template = Template::new(file)
        .missing_key(MissingKey::Error)
        .funcs(funcs.clone());
    for (helper_file, helper) in helpers {
        template = template.parse(helper).map_err(|e| TemplateError {
            file: helper_file.clone(),
            message: e.to_string(),
        })?;
    }
    let template = template.parse(source).map_err(|e| err(e.to_string()))?;
    template
        .execute_to_string(&data)
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_with_context_and_helpers() {
        let helpers = vec![(
            "_helpers.tpl".to_owned(),
            r#"{{ define "name" }}{{ .package.metadata.name }}-x{{ end }}"#.to_owned(),
        )];
        let out = render(
            "cm.yaml.gotmpl",
            "name: {{ template \"name\" . }}\nreplicas: {{ .config.replicas }}",
            &helpers,
            &FuncMap::new(),
            &json!({"package": {"metadata": {"name": "pkg"}}, "config": {"replicas": 3}}),
        )
        .unwrap();
        assert_eq!(out, "name: pkg-x\nreplicas: 3");
    }

    #[test]
    fn missing_keys_are_errors_naming_the_file() {
        let err = render(
            "deploy.yaml.gotmpl",
            "x: {{ .config.nope }}",
            &[],
            &FuncMap::new(),
            &json!({"config": {}}),
        )
        .unwrap_err();
        assert_eq!(err.file, "deploy.yaml.gotmpl");
        assert!(err.message.contains("nope"), "{}", err.message);
    }
}
