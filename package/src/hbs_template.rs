//! `*.hbs` rendering with handlebars: the same template context as `*.gotmpl` files, strict mode (a missing
//! key is an error, like `missingkey=error`), no HTML escaping (the output is YAML), and every function of
//! `template_funcs.rs` as a helper, so `{{toYaml config.labels}}` or `{{b64enc (upper package.metadata.name)}}`
//! behave as their gotmpl counterparts. `_`-prefixed `.hbs` files are partials, called by their file name
//! without the underscore and extension: `_labels.hbs` is `{{> labels}}`. Errors name file, line and column.

use gotmpl::{FuncMap, ValueFunc};
use handlebars::{
    no_escape, Context, Handlebars, Helper, HelperDef, RenderContext, RenderError,
    RenderErrorReason, ScopedJson,
};
use serde_json::Value;

use super::template::TemplateError;
use super::template_values::to_json;
use crate::render_budget::{BoundedText, RenderBudget};

/// Handlebars' own helpers: a package function of the same name must not shadow them.
const HANDLEBARS_BUILTINS: [&str; 17] = [
    "if", "unless", "each", "with", "lookup", "raw", "log", "eq", "ne", "gt", "gte", "lt", "lte",
    "and", "or", "not", "len",
];

/// A package function exposed as a handlebars helper returning a value (usable in subexpressions).
struct FuncHelper {
    name: String,
    func: ValueFunc,
}

impl HelperDef for FuncHelper {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        helper: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        let args = helper
            .params()
            .iter()
            .map(|p| gotmpl::ser::to_value(p.value()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RenderErrorReason::Other(format!("{}: {e}", self.name)))?;
        let result = (self.func)(&args).map_err(|e| RenderErrorReason::Other(e.to_string()))?;
        Ok(ScopedJson::Derived(to_json(&result)))
    }
}

/// The partial name of a helper file: basename without the leading `_` and the `.hbs` suffix.
fn partial_name(path: &str) -> &str {
    let base = path.rsplit('/').next().unwrap_or(path);
    let base = base.strip_prefix('_').unwrap_or(base);
    base.strip_suffix(".hbs").unwrap_or(base)
}

fn describe(file: &str, error: &RenderError) -> TemplateError {
    let reason = match error.reason() {
        RenderErrorReason::MissingVariable(Some(path)) => format!("missing key {path:?}"),
        other => other.to_string(),
    };
    let message = match (error.line_no, error.column_no) {
        (Some(line), Some(column)) => format!("line {line}, column {column}: {reason}"),
        (Some(line), None) => format!("line {line}: {reason}"),
        _ => reason,
    };
    TemplateError {
        file: error
            .template_name
            .clone()
            .unwrap_or_else(|| file.to_owned()),
        message,
    }
}

/// Renders `source` (from `file`) with `context` as the root; `partials` are (file, source) pairs of
/// `_`-prefixed `.hbs` files and `funcs` become helpers (handlebars' own helpers keep their names).
pub fn render_hbs(
    file: &str,
    source: &str,
    partials: &[(String, String)],
    funcs: &FuncMap,
    context: &Value,
) -> Result<String, TemplateError> {
    let budget = RenderBudget::start();
    let mut registry = Handlebars::new();
    registry.set_strict_mode(true);
    registry.register_escape_fn(no_escape);
    for (name, func) in funcs {
        if !HANDLEBARS_BUILTINS.contains(&name.as_str()) {
            registry.register_helper(
                name,
                Box::new(FuncHelper {
                    name: name.clone(),
                    func: func.clone(),
                }),
            );
        }
    }
    for (partial_file, partial) in partials {
        registry
            .register_partial(partial_name(partial_file), partial)
            .map_err(|e| TemplateError {
                file: partial_file.clone(),
                message: parse_message(&e),
            })?;
    }
    registry
        .register_template_string(file, source)
        .map_err(|e| TemplateError {
            file: file.to_owned(),
            message: parse_message(&e),
        })?;
    let mut out = BoundedText::default();
    match (
        registry.render_to_write(file, context, &mut out),
        budget.exceeded(),
    ) {
        (Ok(()), _) => Ok(out.text),
        // The budget's own words name the function and the limit; handlebars' would not.
        (Err(_), Some(limit)) => Err(TemplateError {
            file: file.to_owned(),
            message: limit,
        }),
        (Err(e), None) => Err(describe(file, &e)),
    }
}

fn parse_message(error: &handlebars::TemplateError) -> String {
    match error.pos() {
        Some((line, column)) => format!("line {line}, column {column}: {}", error.reason()),
        None => error.reason().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::files::PackageFiles;
    use crate::template_funcs::package_funcs;
    use serde_json::json;

    fn funcs(context: &Value) -> FuncMap {
        package_funcs(Arc::new(PackageFiles::new()), Arc::new(context.clone()))
    }

    #[test]
    fn renders_context_helpers_and_partials() {
        let context =
            json!({"package": {"metadata": {"name": "pkg"}}, "config": {"labels": {"a": "b"}}});
        let partials = vec![(
            "_labels.hbs".to_owned(),
            "labels:\n{{indent 2 (toYaml config.labels)}}\n".to_owned(),
        )];
        let out = render_hbs(
            "cm.yaml.hbs",
            "name: {{upper package.metadata.name}}\n{{> labels}}\nraw: {{config.labels.a}}<&>",
            &partials,
            &funcs(&context),
            &context,
        )
        .unwrap();
        assert_eq!(out, "name: PKG\nlabels:\n  a: b\nraw: b<&>");
    }

    #[test]
    fn handlebars_builtins_keep_their_meaning() {
        let context = json!({"config": {"items": ["x", "y"], "on": true}});
        let out = render_hbs(
            "list.yaml.hbs",
            "{{#if config.on}}{{#each config.items}}- {{this}}\n{{/each}}{{/if}}",
            &[],
            &funcs(&context),
            &context,
        )
        .unwrap();
        assert_eq!(out, "- x\n- y\n");
    }

    #[test]
    fn missing_keys_name_file_line_and_key() {
        let context = json!({"config": {}});
        let err = render_hbs(
            "deploy.yaml.hbs",
            "a: 1\nb: {{config.replicas}}",
            &[],
            &funcs(&context),
            &context,
        )
        .unwrap_err();
        assert_eq!(err.file, "deploy.yaml.hbs");
        assert!(err.message.starts_with("line 2"), "{}", err.message);
        assert!(err.message.contains("config.replicas"), "{}", err.message);
    }

    #[test]
    fn syntax_errors_name_the_position() {
        let err =
            render_hbs("x.yaml.hbs", "a: {{#if}}", &[], &FuncMap::new(), &json!({})).unwrap_err();
        assert_eq!(err.file, "x.yaml.hbs");
        assert!(err.message.contains("line 1"), "{}", err.message);
    }

    #[test]
    fn function_errors_surface() {
        let context = json!({});
        let err = render_hbs(
            "x.yaml.hbs",
            "a: {{b64dec \"!!\"}}",
            &[],
            &funcs(&context),
            &context,
        )
        .unwrap_err();
        assert!(err.message.contains("b64dec"), "{}", err.message);
    }
}
