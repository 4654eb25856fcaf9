//! Fuzzing by property (issue 17, item 8): hostile input to the template engines, the package loader and
//! CEL ends as an error or a result, never a panic. Inputs are built from the pieces attackers combine
//! (template actions, sprig functions with large numbers, YAML anchors and nesting, CEL macros), and each
//! property runs a bounded number of cases so CI time stays fixed (`PROPTEST_CASES` raises it locally).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pko_package::cel::{compile_bounded, evaluate_cel_with};
use pko_package::files::PackageFiles;
use pko_package::hbs_template::render_hbs;
use pko_package::loader::load_package;
use pko_package::template::render;
use pko_package::template_funcs::package_funcs;
use proptest::prelude::*;
use serde_json::json;

const MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: fuzz}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: main}]\n";

fn template_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{{ .config.x }}".to_owned()),
        Just("{{ range until 5 }}x{{ end }}".to_owned()),
        Just("{{ include \"h\" . }}".to_owned()),
        Just("{{ define \"h\" }}{{ include \"h\" . }}{{ end }}".to_owned()),
        Just("{{ $s := \"ab\" }}{{ $s = cat $s $s }}".to_owned()),
        Just("{{ if".to_owned()),
        Just("{{ end }}".to_owned()),
        Just("}}".to_owned()),
        (any::<i64>()).prop_map(|n| format!("{{{{ repeat {n} \"x\" }}}}")),
        (any::<i64>(), any::<i64>()).prop_map(|(a, b)| format!("{{{{ div {a} {b} }}}}")),
        (any::<i64>(), any::<i64>()).prop_map(|(a, b)| format!("{{{{ mod {a} {b} }}}}")),
        (any::<i64>()).prop_map(|n| format!("{{{{ indent {n} \"a\" }}}}")),
        (any::<i64>()).prop_map(|n| format!("{{{{ until {n} | len }}}}")),
        "[ -~]{0,20}",
    ]
}

fn handlebars_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{{config.x}}".to_owned()),
        Just("{{#each config.list}}{{this}}{{/each}}".to_owned()),
        Just("{{#if config.x}}".to_owned()),
        Just("{{/if}}".to_owned()),
        Just("{{> _p}}".to_owned()),
        Just("{{{{raw}}}}".to_owned()),
        "[ -~]{0,20}",
    ]
}

fn yaml_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a: &a [1, 2, 3]\n".to_owned()),
        Just("b: &b [*a, *a, *a, *a]\n".to_owned()),
        Just("c: [*b, *b, *b, *b]\n".to_owned()),
        Just("d: *undefined\n".to_owned()),
        Just("---\n".to_owned()),
        Just("e: [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]\n".to_owned()),
        Just("metadata: {name: x, annotations: {package-operator.run/phase: main}}\n".to_owned()),
        Just("apiVersion: v1\nkind: ConfigMap\n".to_owned()),
        Just("  - !!binary aGk=\n".to_owned()),
        "[ -~\n]{0,30}",
    ]
}

fn cel_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("self.a".to_owned()),
        Just("self.a.all(x, ".to_owned()),
        Just("self.a.exists(y, ".to_owned()),
        Just("self.a.map(z, z)".to_owned()),
        Just(")".to_owned()),
        Just(" == ".to_owned()),
        Just(" && ".to_owned()),
        Just("size(".to_owned()),
        Just("x".to_owned()),
        Just("'s'.matches('(a+)+$')".to_owned()),
        (any::<i64>()).prop_map(|n| n.to_string()),
        "[ -~]{0,8}",
    ]
}

fn joined(piece: impl Strategy<Value = String>, most: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(piece, 0..most).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn go_templates_never_panic(source in joined(template_piece(), 8)) {
        let context = json!({"config": {"x": 1}});
        let funcs = package_funcs(Arc::new(PackageFiles::new()), Arc::new(context.clone()));
        let _ = render("fuzz.yaml.gotmpl", &source, &[], &funcs, &context);
    }

    #[test]
    fn handlebars_templates_never_panic(source in joined(handlebars_piece(), 8)) {
        let context = json!({"config": {"x": 1, "list": [1, 2, 3]}});
        let funcs = package_funcs(Arc::new(PackageFiles::new()), Arc::new(context.clone()));
        let partials = vec![("_p.hbs".to_owned(), "{{> _p}}".to_owned())];
        let _ = render_hbs("fuzz.yaml.hbs", &source, &partials, &funcs, &context);
    }

    #[test]
    fn the_package_loader_never_panics(object in joined(yaml_piece(), 10), manifest_tail in joined(yaml_piece(), 3)) {
        let files: PackageFiles = [
            ("manifest.yaml".to_owned(), format!("{MANIFEST}{manifest_tail}").into_bytes()),
            ("object.yaml".to_owned(), object.into_bytes()),
        ]
        .into();
        let _ = load_package(&files, &json!({"config": {}}));
    }

    #[test]
    fn cel_rules_never_panic(rule in joined(cel_piece(), 8), width in 0usize..50) {
        if let Ok(compiled) = compile_bounded(&rule) {
            let object = json!({"a": (0..width).collect::<Vec<_>>()});
            let _ = evaluate_cel_with(&compiled, [("self", &object)]);
        }
    }
}
