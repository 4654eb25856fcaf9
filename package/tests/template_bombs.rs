//! Hostile templates end as errors naming the limit they hit, quickly and without exhausting memory
//! (issue 17, item 8). Each case prints how long it took to fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pko_package::files::PackageFiles;
use pko_package::render_budget::MAX_RENDER_TIME;
use pko_package::template::render;
use pko_package::template_funcs::package_funcs;
use serde_json::json;

fn render_with_helpers(
    source: &str,
    helpers: &[(String, String)],
) -> (Result<String, String>, Duration) {
    let context = json!({"config": {}});
    let funcs = package_funcs(Arc::new(PackageFiles::new()), Arc::new(context.clone()));
    let started = Instant::now();
    let result =
        render("bomb.yaml.gotmpl", source, helpers, &funcs, &context).map_err(|e| e.to_string());
    (result, started.elapsed())
}

fn fails_with(source: &str, helpers: &[(String, String)], expected: &str) {
    let (result, took) = render_with_helpers(source, helpers);
    println!("{source:?}: failed after {took:?}");
    match result {
        Err(message) => assert!(message.contains(expected), "{source:?}: {message}"),
        Ok(text) => panic!("{source:?} rendered {} bytes", text.len()),
    }
    assert!(
        took < MAX_RENDER_TIME + Duration::from_secs(5),
        "{source:?} took {took:?}"
    );
}

#[test]
fn huge_strings_are_refused_before_they_are_built() {
    let limit = "text larger than the 16 MiB limit";
    fails_with(r#"{{ repeat 100000000000 "x" }}"#, &[], limit);
    fails_with(r#"{{ "x" | indent 100000000000 }}"#, &[], limit);
    fails_with(r#"{{ "a\nb" | nindent 10000000 }}"#, &[], limit);
    fails_with(
        r#"{{ regexReplaceAll "." (repeat 100000 "x") "$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0" }}"#,
        &[],
        limit,
    );
    // Repeated through a variable: each step is checked, the first one past the limit fails.
    fails_with(
        r#"{{ $s := repeat 1000000 "x" }}{{ range until 64 }}{{ $s = cat $s $s }}{{ end }}{{ $s | len }}"#,
        &[],
        limit,
    );
}

#[test]
fn output_that_grows_past_the_limit_stops() {
    fails_with(
        r#"{{ range until 100000 }}{{ repeat 1000 "x" }}{{ end }}"#,
        &[],
        "text larger than the 16 MiB limit",
    );
}

#[test]
fn loops_and_includes_are_bounded() {
    // Nested loops: the engine's iteration budget.
    fails_with(
        r#"{{ range until 100000 }}{{ range until 100000 }}{{ end }}{{ end }}"#,
        &[],
        "range iteration budget exhausted",
    );
    // A helper that includes itself twice per level: exponential calls, cut by the include budget.
    let helpers = [(
        "_helpers.tpl".to_owned(),
        r#"{{ define "boom" }}{{ include "boom" . }}{{ include "boom" . }}{{ end }}"#.to_owned(),
    )];
    let (result, took) = render_with_helpers(r#"{{ include "boom" . }}"#, &helpers);
    println!("self-including helper: failed after {took:?}");
    let message = result.unwrap_err();
    assert!(
        message.contains("more than 10000 include calls") || message.contains("nests deeper than"),
        "{message}"
    );
}

#[test]
fn integer_overflow_is_an_error_not_a_panic() {
    for source in [
        "{{ add 9223372036854775807 1 }}",
        "{{ add1 9223372036854775807 }}",
        "{{ mul 9223372036854775807 2 }}",
        // i64::MIN is built: Go's parser cannot read its literal.
        "{{ sub (sub 0 9223372036854775807) 2 }}",
        "{{ div (sub (sub 0 9223372036854775807) 1) -1 }}",
        "{{ mod (sub (sub 0 9223372036854775807) 1) -1 }}",
    ] {
        fails_with(source, &[], "integer overflow");
    }
}

#[test]
fn ordinary_templates_still_render() {
    let (result, _) = render_with_helpers(
        r#"{{ range $i := until 3 }}{{ repeat 2 "ab" | indent 2 }}{{ add $i 1 }};{{ end }}"#,
        &[],
    );
    assert_eq!(result.unwrap(), "  abab1;  abab2;  abab3;");
}

fn render_handlebars(
    source: &str,
    partials: &[(String, String)],
) -> (Result<String, String>, Duration) {
    let context = json!({"config": {}});
    let funcs = package_funcs(Arc::new(PackageFiles::new()), Arc::new(context.clone()));
    let started = Instant::now();
    let result =
        pko_package::hbs_template::render_hbs("bomb.yaml.hbs", source, partials, &funcs, &context)
            .map_err(|e| e.to_string());
    (result, started.elapsed())
}

#[test]
fn handlebars_templates_have_the_same_budget() {
    for (source, expected) in [
        (
            r#"{{repeat 100000000000 "x"}}"#,
            "repeat: text larger than the 16 MiB limit",
        ),
        (
            r#"{{#each (until 100000)}}{{#each (until 100000)}}xxxxxxxxxx{{/each}}{{/each}}"#,
            "output: text larger than the 16 MiB limit",
        ),
    ] {
        let (result, took) = render_handlebars(source, &[]);
        println!("{source:?}: failed after {took:?}");
        let message = result.unwrap_err();
        assert!(message.contains(expected), "{source:?}: {message}");
    }
}

#[test]
fn a_partial_that_calls_itself_is_an_error() {
    let partials = [("_boom.hbs".to_owned(), "x{{> boom}}".to_owned())];
    let (result, took) = render_handlebars("{{> boom}}", &partials);
    println!("self-calling partial: failed after {took:?}");
    assert!(result.is_err(), "{result:?}");
}

#[test]
fn a_template_that_calls_itself_is_an_error() {
    let helpers = [(
        "_helpers.tpl".to_owned(),
        r#"{{ define "loop" }}x{{ template "loop" . }}{{ end }}"#.to_owned(),
    )];
    let (result, took) = render_with_helpers(r#"{{ template "loop" . }}"#, &helpers);
    println!("self-calling template: failed after {took:?}");
    let message = result.unwrap_err();
    assert!(message.contains("recursion limit exceeded"), "{message}");
}

#[test]
fn go_builtins_cannot_double_a_string_without_bound() {
    for source in [
        r#"{{ $s := "xxxxxxxxxxxxxxxx" }}{{ range until 64 }}{{ $s = printf "%s%s" $s $s }}{{ end }}{{ len $s }}"#,
        r#"{{ $s := "xxxx" }}{{ range until 64 }}{{ $s = print $s $s }}{{ end }}{{ len $s }}"#,
    ] {
        fails_with(source, &[], "text larger than the 16 MiB limit");
    }
}
