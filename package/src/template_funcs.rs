//! The functions package templates may call beyond Go's builtins: the part of Sprig Package Operator allows
//! that packages use in practice (strings, defaults and choices, lists and dicts, encodings) and pko's own helpers
//! (`toYaml`, `fromYaml`, `toJson`, `fromJson`, `getFile`, `getFileGlob`, `cel`). Nothing here reads the
//! clock, randomness, the environment or the network: a package renders the same everywhere.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use gotmpl::{FuncMap, Value};
use serde_json::Value as Json;

use super::files::PackageFiles;
use super::template_values::{arg, display, fail, from_json, is_empty, string_arg, to_json};
use crate::cel::{compile_bounded, evaluate_cel_with};
use crate::render_budget::{check_text, guard_text_builtins, guarded};
use crate::yaml::parse_untrusted_yaml;

/// `text` with every line indented by `spaces`; the result's size is checked before it is built.
fn indent(name: &str, text: &str, spaces: usize) -> Result<String, gotmpl::TemplateError> {
    let lines = text.split('\n').count();
    check_text(
        name,
        text.len().saturating_add(lines.saturating_mul(spaces)),
    )?;
    let pad = " ".repeat(spaces);
    Ok(text
        .split('\n')
        .map(|l| format!("{pad}{l}"))
        .collect::<Vec<_>>()
        .join("\n"))
}

fn string_fn(
    map: &mut FuncMap,
    name: &'static str,
    f: impl Fn(&str) -> String + Send + Sync + 'static,
) {
    map.insert(
        name.into(),
        Arc::new(move |args: &[Value]| Ok(Value::from(f(&string_arg(name, args, 0)?)))),
    );
}

/// Every extra function, bound to the package's files (for `getFile`) and the template context (for
/// `cel`), with Go's text-building builtins, all checked against the render budget
/// (`render_budget.rs`).
pub fn package_funcs(files: Arc<PackageFiles>, context: Arc<Json>) -> FuncMap {
    let mut map = FuncMap::new();
    super::sprig_funcs::register(&mut map);
    string_funcs(&mut map);
    collection_funcs(&mut map);
    encoding_funcs(&mut map);
    choice_funcs(&mut map);
    file_and_cel_funcs(&mut map, files, context);
    // Go's text-building builtins join the map so they are checked too; everything within the budget.
    guard_text_builtins(&mut map);
    guarded(map)
}

/// Strings: case, trimming, quoting, base64, search and replace, indentation.
fn string_funcs(map: &mut FuncMap) {
    string_fn(map, "upper", str::to_uppercase);
    string_fn(map, "lower", str::to_lowercase);
    string_fn(map, "trim", |s| s.trim().to_owned());
    string_fn(map, "quote", |s| format!("{s:?}"));
    string_fn(map, "squote", |s| format!("'{s}'"));
    string_fn(map, "b64enc", |s| {
        base64::engine::general_purpose::STANDARD.encode(s)
    });
    map.insert(
        "b64dec".into(),
        Arc::new(|args: &[Value]| {
            let s = string_arg("b64dec", args, 0)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(s.trim())
                .map_err(|e| fail("b64dec", e))?;
            String::from_utf8(bytes)
                .map(Value::from)
                .map_err(|e| fail("b64dec", e))
        }),
    );
    map.insert(
        "toString".into(),
        Arc::new(|args: &[Value]| Ok(Value::from(display(arg("toString", args, 0)?)))),
    );
    map.insert(
        "contains".into(),
        Arc::new(|args: &[Value]| {
            Ok(Value::Bool(
                string_arg("contains", args, 1)?.contains(&string_arg("contains", args, 0)?),
            ))
        }),
    );
    map.insert(
        "hasPrefix".into(),
        Arc::new(|args: &[Value]| {
            Ok(Value::Bool(
                string_arg("hasPrefix", args, 1)?.starts_with(&string_arg("hasPrefix", args, 0)?),
            ))
        }),
    );
    map.insert(
        "hasSuffix".into(),
        Arc::new(|args: &[Value]| {
            Ok(Value::Bool(
                string_arg("hasSuffix", args, 1)?.ends_with(&string_arg("hasSuffix", args, 0)?),
            ))
        }),
    );
    map.insert(
        "replace".into(),
        Arc::new(|args: &[Value]| {
            let (old, new, s) = (
                string_arg("replace", args, 0)?,
                string_arg("replace", args, 1)?,
                string_arg("replace", args, 2)?,
            );
            Ok(Value::from(s.replace(&old, &new)))
        }),
    );
    map.insert(
        "trimPrefix".into(),
        Arc::new(|args: &[Value]| {
            let (prefix, s) = (
                string_arg("trimPrefix", args, 0)?,
                string_arg("trimPrefix", args, 1)?,
            );
            Ok(Value::from(
                s.strip_prefix(&prefix).unwrap_or(&s).to_owned(),
            ))
        }),
    );
    map.insert(
        "trimSuffix".into(),
        Arc::new(|args: &[Value]| {
            let (suffix, s) = (
                string_arg("trimSuffix", args, 0)?,
                string_arg("trimSuffix", args, 1)?,
            );
            Ok(Value::from(
                s.strip_suffix(&suffix).unwrap_or(&s).to_owned(),
            ))
        }),
    );
    map.insert(
        "indent".into(),
        Arc::new(|args: &[Value]| {
            let n = arg("indent", args, 0)?
                .as_int()
                .ok_or_else(|| fail("indent", "width must be an integer"))?;
            Ok(Value::from(indent(
                "indent",
                &string_arg("indent", args, 1)?,
                usize::try_from(n).unwrap_or(0),
            )?))
        }),
    );
    map.insert(
        "nindent".into(),
        Arc::new(|args: &[Value]| {
            let n = arg("nindent", args, 0)?
                .as_int()
                .ok_or_else(|| fail("nindent", "width must be an integer"))?;
            Ok(Value::from(format!(
                "\n{}",
                indent(
                    "nindent",
                    &string_arg("nindent", args, 1)?,
                    usize::try_from(n).unwrap_or(0)
                )?
            )))
        }),
    );
}

/// Defaults and emptiness, lists, dicts and joins.
fn collection_funcs(map: &mut FuncMap) {
    map.insert(
        "default".into(),
        Arc::new(|args: &[Value]| {
            let fallback = arg("default", args, 0)?;
            Ok(match args.get(1) {
                Some(v) if !is_empty(v) => v.clone(),
                _ => fallback.clone(),
            })
        }),
    );
    map.insert(
        "empty".into(),
        Arc::new(|args: &[Value]| Ok(Value::Bool(args.first().is_none_or(is_empty)))),
    );
    map.insert(
        "required".into(),
        Arc::new(|args: &[Value]| {
            let message = string_arg("required", args, 0)?;
            match args.get(1) {
                Some(v) if !matches!(v, Value::Nil) => Ok(v.clone()),
                _ => Err(fail("required", message)),
            }
        }),
    );
    map.insert(
        "list".into(),
        Arc::new(|args: &[Value]| Ok(Value::from(args.to_vec()))),
    );
    map.insert(
        "dict".into(),
        Arc::new(|args: &[Value]| {
            if args.len() % 2 != 0 {
                return Err(fail("dict", "needs key/value pairs"));
            }
            let map: BTreeMap<String, Value> = args
                .chunks(2)
                .map(|kv| (display(&kv[0]), kv[1].clone()))
                .collect();
            Ok(Value::from(map))
        }),
    );
    map.insert(
        "join".into(),
        Arc::new(|args: &[Value]| {
            let sep = string_arg("join", args, 0)?;
            match arg("join", args, 1)? {
                Value::List(items) => Ok(Value::from(
                    items.iter().map(display).collect::<Vec<_>>().join(&sep),
                )),
                other => Ok(Value::from(display(other))),
            }
        }),
    );
}

/// JSON and YAML, both ways (parsed as untrusted input).
fn encoding_funcs(map: &mut FuncMap) {
    map.insert(
        "toJson".into(),
        Arc::new(|args: &[Value]| Ok(Value::from(to_json(arg("toJson", args, 0)?).to_string()))),
    );
    map.insert(
        "fromJson".into(),
        Arc::new(|args: &[Value]| {
            let json: Json = serde_json::from_str(&string_arg("fromJson", args, 0)?)
                .map_err(|e| fail("fromJson", e))?;
            from_json("fromJson", &json)
        }),
    );
    map.insert(
        "toYaml".into(),
        Arc::new(|args: &[Value]| {
            let yaml = serde_saphyr::to_string(&to_json(arg("toYaml", args, 0)?))
                .map_err(|e| fail("toYaml", e))?;
            Ok(Value::from(yaml.trim_end().to_owned()))
        }),
    );
    map.insert(
        "fromYaml".into(),
        Arc::new(|args: &[Value]| {
            let json: Json = parse_untrusted_yaml(&string_arg("fromYaml", args, 0)?)
                .map_err(|e| fail("fromYaml", e))?;
            from_json("fromYaml", &json)
        }),
    );
}

/// Dict lookups, choices, and slicing and splitting strings.
fn choice_funcs(map: &mut FuncMap) {
    map.insert(
        "hasKey".into(),
        Arc::new(|args: &[Value]| match arg("hasKey", args, 0)? {
            Value::Map(m) => Ok(Value::Bool(
                m.contains_key(string_arg("hasKey", args, 1)?.as_str()),
            )),
            _ => Err(fail("hasKey", "the first argument must be a map")),
        }),
    );
    map.insert(
        "keys".into(),
        Arc::new(|args: &[Value]| match arg("keys", args, 0)? {
            // Sorted: output must not depend on map order.
            Value::Map(m) => {
                let mut keys: Vec<String> = m.keys().map(|k| k.to_string()).collect();
                keys.sort();
                Ok(Value::from(
                    keys.into_iter().map(Value::from).collect::<Vec<_>>(),
                ))
            }
            _ => Err(fail("keys", "the argument must be a map")),
        }),
    );
    map.insert(
        "ternary".into(),
        Arc::new(|args: &[Value]| {
            let chosen = if is_empty(arg("ternary", args, 2)?) {
                1
            } else {
                0
            };
            Ok(arg("ternary", args, chosen)?.clone())
        }),
    );
    map.insert(
        "coalesce".into(),
        Arc::new(|args: &[Value]| {
            Ok(args
                .iter()
                .find(|v| !is_empty(v))
                .cloned()
                .unwrap_or(Value::Nil))
        }),
    );
    map.insert(
        "trunc".into(),
        Arc::new(|args: &[Value]| {
            let length = match arg("trunc", args, 0)? {
                Value::Int(i) => *i,
                other => display(other).parse().map_err(|e| fail("trunc", e))?,
            };
            let text = string_arg("trunc", args, 1)?;
            let count = text.chars().count() as i64;
            let out: String = if length >= 0 {
                text.chars().take(length as usize).collect()
            } else {
                text.chars()
                    .skip((count + length).max(0) as usize)
                    .collect()
            };
            Ok(Value::from(out))
        }),
    );
    map.insert(
        "splitList".into(),
        Arc::new(|args: &[Value]| {
            let sep = string_arg("splitList", args, 0)?;
            let text = string_arg("splitList", args, 1)?;
            Ok(Value::from(
                text.split(sep.as_str())
                    .map(Value::from)
                    .collect::<Vec<_>>(),
            ))
        }),
    );
}

/// pko's own: the package's files (`getFile`, `getFileGlob`) and CEL over the template context (`cel`).
fn file_and_cel_funcs(map: &mut FuncMap, files: Arc<PackageFiles>, context: Arc<Json>) {
    let file_source = files.clone();
    map.insert(
        "getFile".into(),
        Arc::new(move |args: &[Value]| {
            let path = string_arg("getFile", args, 0)?;
            let bytes = file_source
                .get(&path)
                .ok_or_else(|| fail("getFile", format!("no file {path:?} in the package")))?;
            String::from_utf8(bytes.clone())
                .map(Value::from)
                .map_err(|e| fail("getFile", e))
        }),
    );
    map.insert(
        "getFileGlob".into(),
        Arc::new(move |args: &[Value]| {
            let pattern = string_arg("getFileGlob", args, 0)?;
            let found: BTreeMap<String, Value> = files
                .iter()
                .filter(|(path, _)| glob_match(&pattern, path))
                .map(|(path, bytes)| {
                    (
                        path.clone(),
                        Value::from(String::from_utf8_lossy(bytes).into_owned()),
                    )
                })
                .collect();
            Ok(Value::from(found))
        }),
    );
    map.insert(
        "cel".into(),
        Arc::new(move |args: &[Value]| {
            let rule = string_arg("cel", args, 0)?;
            let program =
                compile_bounded(&rule).map_err(|e| fail("cel", format!("{rule:?}: {e}")))?;
            // The context's top-level keys (`package`, `config`, `environment`, ...) are the variables.
            let variables = context
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v));
            evaluate_cel_with(&program, variables)
                .map(Value::Bool)
                .map_err(|e| fail("cel", format!("{rule:?}: {e}")))
        }),
    );
}

/// `*` within a path segment, `**` across segments, `?` one character.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p {
            [] => s.is_empty(),
            [b'*', b'*', rest @ ..] => {
                let rest = rest.strip_prefix(b"/").unwrap_or(rest);
                (0..=s.len()).any(|i| go(rest, &s[i..]))
            }
            [b'*', rest @ ..] => (0..=s.len())
                .take_while(|&i| i == 0 || s[i - 1] != b'/')
                .any(|i| go(rest, &s[i..])),
            [b'?', rest @ ..] => !s.is_empty() && s[0] != b'/' && go(rest, &s[1..]),
            [c, rest @ ..] => !s.is_empty() && s[0] == *c && go(rest, &s[1..]),
        }
    }
    go(pattern.as_bytes(), path.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::render;
    use serde_json::json;

    fn run(source: &str, context: Json) -> std::result::Result<String, String> {
        let mut files = PackageFiles::new();
        files.insert("files/motd.txt".into(), b"hello".to_vec());
        files.insert("files/sub/a.conf".into(), b"a=1".to_vec());
        files.insert("other/b.conf".into(), b"b=2".to_vec());
        let funcs = package_funcs(Arc::new(files), Arc::new(context.clone()));
        render("t.gotmpl", source, &[], &funcs, &context).map_err(|e| e.message)
    }

    #[test]
    fn strings_defaults_and_encodings() {
        let ctx = json!({"config": {"name": "Web", "empty": ""}});
        assert_eq!(
            run(
                "{{ .config.name | upper }} {{ .config.name | lower | quote }}",
                ctx.clone()
            )
            .unwrap(),
            "WEB \"web\""
        );
        assert_eq!(
            run("{{ .config.empty | default \"fallback\" }}", ctx.clone()).unwrap(),
            "fallback"
        );
        assert_eq!(
            run("{{ \"hi\" | b64enc }} {{ \"aGk=\" | b64dec }}", ctx.clone()).unwrap(),
            "aGk= hi"
        );
        assert_eq!(
            run("{{ replace \"a\" \"b\" \"banana\" }}", ctx.clone()).unwrap(),
            "bbnbnb"
        );
        assert_eq!(
            run(
                "{{ trimPrefix \"v\" \"v1.2\" }}|{{ hasPrefix \"v\" \"v1\" }}",
                ctx.clone()
            )
            .unwrap(),
            "1.2|true"
        );
        let err = run(
            "{{ required \"config.image is required\" .config.image }}",
            json!({"config": {"image": null}}),
        );
        assert!(err.unwrap_err().contains("config.image is required"));
    }

    #[test]
    fn maps_choices_and_string_slicing() {
        let ctx =
            json!({"config": {"labels": {"b": "2", "a": "1"}, "empty": "", "name": "frontend"}});
        assert_eq!(
            run("{{ hasKey .config.labels \"a\" }} {{ hasKey .config.labels \"z\" }} {{ keys .config.labels | join \",\" }}", ctx.clone()).unwrap(),
            "true false a,b"
        );
        assert_eq!(
            run("{{ ternary \"yes\" \"no\" true }} {{ ternary \"yes\" \"no\" .config.empty }} {{ coalesce .config.empty \"x\" }}", ctx.clone()).unwrap(),
            "yes no x"
        );
        assert_eq!(
            run("{{ trunc 5 .config.name }} {{ trunc -3 .config.name }} {{ splitList \",\" \"a,b\" | join \"+\" }}", ctx.clone()).unwrap(),
            "front end a+b"
        );
        assert!(run("{{ hasKey \"s\" \"a\" }}", ctx)
            .unwrap_err()
            .contains("must be a map"));
    }

    #[test]
    fn yaml_json_lists_and_dicts() {
        let ctx = json!({"config": {"labels": {"a": "1", "b": "2"}}});
        assert_eq!(
            run(
                "labels:{{ .config.labels | toYaml | nindent 2 }}",
                ctx.clone()
            )
            .unwrap(),
            "labels:\n  a: \"1\"\n  b: \"2\""
        );
        assert_eq!(
            run("{{ .config.labels | toJson }}", ctx.clone()).unwrap(),
            r#"{"a":"1","b":"2"}"#
        );
        assert_eq!(
            run("{{ (fromYaml \"x: 3\").x }}", ctx.clone()).unwrap(),
            "3"
        );
        assert_eq!(
            run("{{ join \",\" (list \"a\" \"b\" 3) }}", ctx.clone()).unwrap(),
            "a,b,3"
        );
        assert_eq!(run("{{ (dict \"k\" \"v\").k }}", ctx).unwrap(), "v");
    }

    #[test]
    fn files_and_cel() {
        let ctx = json!({"config": {"replicas": 3}});
        assert_eq!(
            run("{{ getFile \"files/motd.txt\" }}", ctx.clone()).unwrap(),
            "hello"
        );
        assert!(run("{{ getFile \"nope\" }}", ctx.clone())
            .unwrap_err()
            .contains("no file \"nope\""));
        assert_eq!(
            run(
                "{{ range $p, $c := getFileGlob \"files/**/*.conf\" }}{{ $p }}={{ $c }};{{ end }}",
                ctx.clone()
            )
            .unwrap(),
            "files/sub/a.conf=a=1;"
        );
        assert_eq!(
            run(
                "{{ if cel \"config.replicas > 2\" }}big{{ end }}",
                ctx.clone()
            )
            .unwrap(),
            "big"
        );
        assert!(run("{{ cel \"config.(\" }}", ctx)
            .unwrap_err()
            .contains("cel"));
    }

    #[test]
    fn globs() {
        assert!(glob_match("*.yaml", "a.yaml"));
        assert!(!glob_match("*.yaml", "dir/a.yaml"));
        assert!(glob_match("**/*.yaml", "dir/sub/a.yaml"));
        assert!(glob_match("**/*.yaml", "a.yaml"));
        assert!(glob_match("dir/?.yaml", "dir/a.yaml"));
        assert!(!glob_match("dir/?.yaml", "dir/ab.yaml"));
    }
}
