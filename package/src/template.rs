//! `*.gotmpl` rendering: Go text/template semantics (the gotmpl crate) with `missingkey=error`, the
//! functions of `template_funcs.rs`, and the package's `_`-prefixed helper files, whose `define`d templates
//! every template can call with `{{ template "name" . }}`, or with `{{ include "name" . }}` to use the
//! output as a value (`{{ include "labels" . | indent 4 }}`). Errors name the file.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use gotmpl::{FuncMap, MissingKey, Template, Value as TemplateValue};

use crate::render_budget::{count_include, BoundedText, RenderBudget};
use serde_json::Value;

/// Deepest `include` nesting; deeper means a helper includes itself.
const MAX_INCLUDE_DEPTH: usize = 32;

thread_local! {
    static INCLUDE_DEPTH: Cell<usize> = const { Cell::new(0) };
}

fn parse_all(
    name: &str,
    helpers: &[(String, String)],
    funcs: FuncMap,
) -> Result<Template, TemplateError> {
    let mut template = Template::new(name)
        .missing_key(MissingKey::Error)
        .funcs(funcs);
    for (helper_file, helper) in helpers {
        template = template.parse(helper).map_err(|e| TemplateError {
            file: helper_file.clone(),
            message: e.to_string(),
        })?;
    }
    Ok(template)
}

/// `base` plus `include`, which renders a `define`d template of the helpers with the given data. The
/// closure keeps `base`, not the finished map, and builds the map again for nested includes: no cycle.
fn with_include(base: FuncMap, helpers: Arc<Vec<(String, String)>>) -> FuncMap {
    let mut funcs = base.clone();
    funcs.insert(
        "include".into(),
        Arc::new(move |args: &[TemplateValue]| {
            let fail = |m: String| gotmpl::TemplateError::Exec(format!("include: {m}"));
            let name = match args.first() {
                Some(TemplateValue::String(s)) => s.to_string(),
                _ => return Err(fail("the first argument names a template".to_owned())),
            };
            let data = args.get(1).cloned().unwrap_or(TemplateValue::Nil);
            let depth = INCLUDE_DEPTH.with(|d| d.get());
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(fail(format!(
                    "{name:?} nests deeper than {MAX_INCLUDE_DEPTH} levels"
                )));
            }
            let nested = with_include(base.clone(), helpers.clone());
            let template = parse_all("include", &helpers, nested)
                .and_then(|t| {
                    t.parse(&format!("{{{{ template {name:?} . }}}}"))
                        .map_err(|e| TemplateError {
                            file: "include".to_owned(),
                            message: e.to_string(),
                        })
                })
                .map_err(|e| fail(e.to_string()))?;
            count_include()?;
            INCLUDE_DEPTH.with(|d| d.set(depth + 1));
            let out = execute_bounded(&template, &data);
            INCLUDE_DEPTH.with(|d| d.set(depth));
            out.map(TemplateValue::from)
                .map_err(|e| fail(format!("{name:?}: {e}")))
        }),
    );
    funcs
}

type TemplateMap = BTreeMap<Arc<str>, TemplateValue>;

/// The one map that stands for upstream's typed, empty `map[string]string`: upstream's context goes
/// through JSON (every map untyped, so `index` of a missing key prints `<no value>`), except that it puts
/// an empty `map[string]string` where the Package has no labels or annotations. `index` of a missing key
/// there is Go's zero string. Recognised by identity, so no other empty map of the context behaves so.
static EMPTY_STRING_MAP: LazyLock<Arc<TemplateMap>> = LazyLock::new(Arc::default);

/// `.package.metadata.labels` and `.annotations` as upstream types them when the Package has none (an
/// object's empty map is no map to the apiserver, so empty counts as none).
fn with_typed_metadata_maps(data: &mut TemplateValue) {
    let TemplateValue::Map(root) = data else {
        return;
    };
    let Some(TemplateValue::Map(package)) = Arc::make_mut(root).get_mut("package") else {
        return;
    };
    let Some(TemplateValue::Map(metadata)) = Arc::make_mut(package).get_mut("metadata") else {
        return;
    };
    let metadata = Arc::make_mut(metadata);
    for key in ["labels", "annotations"] {
        let none = match metadata.get(key) {
            None | Some(TemplateValue::Nil) => true,
            Some(TemplateValue::Map(map)) => map.is_empty(),
            Some(_) => false,
        };
        if none {
            metadata.insert(key.into(), TemplateValue::Map(EMPTY_STRING_MAP.clone()));
        }
    }
}

/// Go's `index`, but a string key into [`EMPTY_STRING_MAP`] gives the empty string, not nil.
fn typed_index(args: &[TemplateValue]) -> Result<TemplateValue, gotmpl::TemplateError> {
    let [collection, keys @ ..] = args else {
        return Err(gotmpl::TemplateError::Exec(
            "index: wrong number of args: want at least 1".to_owned(),
        ));
    };
    let mut value = collection.clone();
    for key in keys {
        value = match (&value, key) {
            (TemplateValue::Map(map), TemplateValue::String(_))
                if Arc::ptr_eq(map, &EMPTY_STRING_MAP) =>
            {
                TemplateValue::String("".into())
            }
            _ => value.index(key)?,
        };
    }
    Ok(value)
}

/// Runs `template` into text bounded by the render budget.
fn execute_bounded(
    template: &Template,
    data: &TemplateValue,
) -> Result<String, gotmpl::TemplateError> {
    let mut out = BoundedText::default();
    template.execute_fmt(&mut out, data)?;
    Ok(out.text)
}

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
    let budget = RenderBudget::start();
    let mut data = gotmpl::ser::to_value(context).map_err(|e| err(e.to_string()))?;
    with_typed_metadata_maps(&mut data);
    let mut funcs = funcs.clone();
    funcs.insert("index".into(), Arc::new(typed_index));
    let template = parse_all(
        file,
        helpers,
        with_include(funcs, Arc::new(helpers.to_vec())),
    )?;
    let template = template.parse(source).map_err(|e| err(e.to_string()))?;
    execute_bounded(&template, &data).map_err(|e| {
        if let Some(limit) = budget.exceeded() {
            return err(limit);
        }
        let lines = match &e {
            gotmpl::TemplateError::MissingKey { key } => key_lines(source, key),
            _ => Vec::new(),
        };
        err(match lines.as_slice() {
            [] => e.to_string(),
            [line] => format!("line {line}: {e}"),
            several => format!(
                "lines {}: {e}",
                several
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    })
}

/// The lines of `source` that access `.key` (gotmpl reports no position for execution errors; the key
/// usually pins it down).
fn key_lines(source: &str, key: &str) -> Vec<usize> {
    let needle = format!(".{key}");
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            line.match_indices(&needle).any(|(at, _)| {
                line[at + needle.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !is_ident(c))
            })
        })
        .map(|(i, _)| i + 1)
        .collect()
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
    fn include_returns_a_helpers_output_as_a_value() {
        let helpers = vec![(
            "_helpers.tpl".to_owned(),
            concat!(
                r#"{{ define "labels" }}app: {{ .name }}{{ "\n" }}tier: web{{ end }}"#,
                r#"{{ define "outer" }}[{{ include "labels" . | upper }}]{{ end }}"#,
                r#"{{ define "loop" }}{{ include "loop" . }}{{ end }}"#,
            )
            .to_owned(),
        )];
        let funcs = crate::template_funcs::package_funcs(Default::default(), Default::default());
        let out = render(
            "cm.yaml.gotmpl",
            "labels:\n{{ include \"labels\" .config | indent 2 }}\n{{ include \"outer\" .config }}",
            &helpers,
            &funcs,
            &json!({"config": {"name": "shop"}}),
        )
        .unwrap();
        assert_eq!(
            out,
            "labels:\n  app: shop\n  tier: web\n[APP: SHOP\nTIER: WEB]"
        );
        let err = render(
            "x.gotmpl",
            "{{ include \"loop\" . }}",
            &helpers,
            &funcs,
            &json!({}),
        )
        .unwrap_err();
        assert!(
            err.message.contains("nests deeper than 32"),
            "{}",
            err.message
        );
        let err = render(
            "x.gotmpl",
            "{{ include \"nope\" . }}",
            &helpers,
            &funcs,
            &json!({}),
        )
        .unwrap_err();
        assert!(err.message.contains("nope"), "{}", err.message);
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
        assert_eq!(err.message, "line 1: map has no entry for key: nope");
        assert_eq!(
            key_lines("a: {{ .x }}\nb: {{ .xy }}\nc: {{ .config.x }}", "x"),
            vec![1, 3]
        );
    }
}

#[cfg(test)]
mod string_map_tests {
    use super::*;
    use serde_json::json;

    fn out(source: &str, context: serde_json::Value) -> Result<String, TemplateError> {
        render("cm.yaml.gotmpl", source, &[], &FuncMap::new(), &context)
    }

    #[test]
    fn index_of_a_missing_key_in_absent_labels_or_annotations_is_empty() {
        let image = r#"image: '{{ index .package.metadata.annotations "test-stub-image" }}'"#;
        for metadata in [
            json!({"name": "p"}),
            json!({"name": "p", "annotations": null, "labels": null}),
        ] {
            let context = json!({"package": {"metadata": metadata}});
            assert_eq!(out(image, context.clone()).unwrap(), "image: ''");
            assert_eq!(
                out(
                    r#"{{ index .package.metadata.labels "a" }}|"#,
                    context.clone()
                )
                .unwrap(),
                "|"
            );
            assert_eq!(
                out(
                    r#"{{ index .package.metadata "annotations" "k" }}|"#,
                    context.clone()
                )
                .unwrap(),
                "|",
                "reached through index as well"
            );
            assert_eq!(
                out("{{ .package.metadata.annotations | len }}", context.clone()).unwrap(),
                "0"
            );
            // Field access on a typed map still obeys missingkey=error, as in Go.
            let err = out("{{ .package.metadata.annotations.k }}", context).unwrap_err();
            assert!(err.message.contains("no entry for key"), "{}", err.message);
        }
    }

    #[test]
    fn other_maps_keep_go_s_untyped_no_value() {
        // Present annotations, config, images and the environment come from JSON: untyped maps.
        let context = json!({
            "package": {"metadata": {"name": "p", "annotations": {"other": "x"}}},
            "config": {},
            "images": {"app": "quay.io/app:1"},
        });
        for source in [
            r#"{{ index .package.metadata.annotations "k" }}"#,
            r#"{{ index .config "k" }}"#,
            r#"{{ index .images "k" }}"#,
        ] {
            assert_eq!(
                out(source, context.clone()).unwrap(),
                "<no value>",
                "{source}"
            );
        }
        assert_eq!(
            out(
                r#"{{ index .package.metadata.annotations "other" }}"#,
                context
            )
            .unwrap(),
            "x"
        );
    }
}
