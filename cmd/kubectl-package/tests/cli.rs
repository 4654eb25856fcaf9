//! `kubectl-package validate` and `tree` on the example packages: exit codes and messages for a valid
//! package and for each kind of broken one.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn packages() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packages")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-package"))
        .args(args)
        .current_dir(packages())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn simple_package_validates_and_shows_its_tree() {
    let out = run(&["validate", "simple", "--config", "simple-config.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        "Package validated: 2 phases, 3 objects."
    );

    let out = run(&["tree", "simple", "--config", "simple-config.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected = "\
Package simple
├── Phase namespace
│   └── v1 Namespace simple-ns
└── Phase deploy
    ├── apps/v1 Deployment simple-ns/simple
    └── v1 ConfigMap simple-ns/simple-settings";
    assert_eq!(stdout(&out).trim_end(), expected);

    // Rendered for a namespace: no Namespace object, everything in the package's namespace.
    let out = run(&[
        "tree",
        "simple",
        "--config",
        "simple-config.yaml",
        "--namespace",
        "team-a",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected = "\
Package simple
├── Phase namespace
└── Phase deploy
    ├── apps/v1 Deployment team-a/simple
    └── v1 ConfigMap team-a/simple-settings";
    assert_eq!(stdout(&out).trim_end(), expected);
}

/// (example, message) from `tests/packages/expected-errors.txt`, shared with the manager's tests.
fn expected_errors() -> Vec<(String, String)> {
    std::fs::read_to_string(packages().join("expected-errors.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (example, message) = l.split_once('\t').unwrap();
            (example.to_owned(), message.to_owned())
        })
        .collect()
}

#[test]
fn broken_packages_name_file_line_and_problem() {
    let cases = expected_errors();
    assert_eq!(cases.len(), 9);
    for (package, expected) in cases {
        let out = run(&["validate", &package]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{package}: {err}");
        assert!(
            err.contains(&format!("kubectl-package: invalid package: {expected}")),
            "{package}: {err}"
        );
    }
}

#[test]
fn config_is_admitted_against_the_manifest_schema() {
    let out = run(&["validate", "simple"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "invalid package: manifest.yaml: config rejected by spec.config.openAPIV3Schema: config.replicas: required"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unreadable_input_is_exit_code_2() {
    let out = run(&["validate", "does-not-exist"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["validate", "simple", "--config", "nope.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("nope.yaml"));
}

#[test]
fn cel_filtering_drops_exactly_the_intended_objects() {
    let single = run(&["tree", "cel-filtering"]);
    assert_eq!(single.status.code(), Some(0), "{}", stderr(&single));
    assert_eq!(
        stdout(&single).trim_end(),
        "Package cel-filtering\n└── Phase main\n    ├── v1 ConfigMap app\n    └── v1 ConfigMap single-instance-notice"
    );
    let ha = run(&["tree", "cel-filtering", "--config", "cel-filtering-ha.yaml"]);
    assert_eq!(ha.status.code(), Some(0), "{}", stderr(&ha));
    assert_eq!(
        stdout(&ha).trim_end(),
        "Package cel-filtering\n└── Phase main\n    ├── v1 ConfigMap app\n    └── v1 ConfigMap ha-budget"
    );
}

#[test]
fn handlebars_package_renders_with_partials_helpers_and_defaults() {
    let out = run(&["tree", "handlebars"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        "Package handlebars\n├── Phase config\n│   └── v1 ConfigMap handlebars-settings\n└── Phase app\n    ├── v1 ConfigMap handlebars-region-eu\n    └── v1 ConfigMap handlebars-region-us"
    );
}

#[test]
fn multi_component_packages_validate_every_component_and_select_one() {
    let out = run(&["validate", "multi-component"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        "Package validated: 1 phases, 1 objects.\nComponent backend validated: 2 phases, 2 objects.\nComponent frontend validated: 2 phases, 2 objects."
    );
    let out = run(&["tree", "multi-component", "--component", "frontend"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        "Package frontend\n├── Phase config\n│   └── v1 ConfigMap frontend-frontend-config\n└── Phase app\n    └── v1 ConfigMap frontend-frontend-app"
    );

    let out = run(&["validate", "multi-component", "--component", "db"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid package: component \"db\" not found in components/ (available: backend, frontend)"),
        "{}",
        stderr(&out)
    );
    let out = run(&["validate", "handlebars", "--component", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid package: manifest.yaml: spec.component is \"x\", but the package is not multi-component (no spec.components)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn locked_images_reach_templates_as_repository_at_digest() {
    let out = run(&["validate", "images"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = tempdir_copy("images");
    let lock = dir.join("manifest.lock.yaml");
    let text = std::fs::read_to_string(&lock)
        .unwrap()
        .replace("team/app:v1", "team/app:v2");
    std::fs::write(&lock, text).unwrap();
    let out = run(&["validate", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid package: manifest.lock.yaml: image \"app\" is locked as \"registry.example/team/app:v2\", the manifest says \"registry.example/team/app:v1\"; run `kubectl-package update`"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A private copy of an example package, subdirectories included (tests edit it).
fn tempdir_copy(example: &str) -> PathBuf {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("pko-cli-{example}-{}", std::process::id()));
    copy(&packages().join(example), &dir);
    dir
}

#[test]
fn template_test_cases_are_kept_as_fixtures_and_diffed() {
    let dir = tempdir_copy("simple");
    let path = dir.to_str().unwrap();
    let config = packages().join("simple-config.yaml");
    let validate = || run(&["validate", path, "--config", config.to_str().unwrap()]);
    let out = validate();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("wrote fixture"),
        "the committed fixtures match"
    );

    let fixture = dir.join(".test-fixtures/namespaced.yaml");
    let text = std::fs::read_to_string(&fixture).unwrap();
    std::fs::write(&fixture, text.replace("replicas: 2", "replicas: 5")).unwrap();
    let out = validate();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid package: test case \"namespaced\": output differs from .test-fixtures/namespaced.yaml (delete it to accept the new output):\nline 16: -\"  replicas: 5\" +\"  replicas: 2\""),
        "{}",
        stderr(&out)
    );

    std::fs::remove_file(&fixture).unwrap();
    let out = validate();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("wrote fixture"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&fixture).unwrap(), text);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn build_writes_an_oci_layout_that_validates_like_the_directory() {
    let tar = std::env::temp_dir().join(format!("pko-cli-layout-{}.tar", std::process::id()));
    let tar_arg = tar.to_str().unwrap();
    let out = run(&[
        "build",
        "handlebars",
        "--output",
        tar_arg,
        "--tag",
        "handlebars:v1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(&format!("Wrote {tar_arg} (")),
        "{}",
        stdout(&out)
    );
    let from_tar = run(&["tree", tar_arg]);
    assert_eq!(from_tar.status.code(), Some(0), "{}", stderr(&from_tar));
    assert_eq!(stdout(&from_tar), stdout(&run(&["tree", "handlebars"])));

    // A broken package is not written; neither target is a usage error.
    std::fs::remove_file(&tar).unwrap();
    let out = run(&["build", "missing-gvk", "--output", tar_arg]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!tar.exists());
    let out = run(&["build", "handlebars"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn tree_renders_a_test_case() {
    let out = run(&["tree", "simple", "--test-case", "namespaced"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        "Package simple\n├── Phase namespace\n└── Phase deploy\n    ├── apps/v1 Deployment team-a/test\n    └── v1 ConfigMap team-a/test-settings"
    );
    let out = run(&["tree", "simple", "--test-case", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out)
            .contains("test case \"nope\" not found in test.template (cases: namespaced, cluster)"),
        "{}",
        stderr(&out)
    );
}
