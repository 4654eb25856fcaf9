//! `build --push` and `--pull` against the real registry of the test environment.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-package"))
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packages"))
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn built_images_validate_and_render_like_their_directory() {
    let host = pko_testenv::shared().unwrap().registry().host();
    let image = format!("{host}/packages/simple:v1");
    let out = run(&[
        "build",
        "simple",
        "--config",
        "simple-config.yaml",
        "--push",
        &image,
        "--plain-http",
        &host,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(&format!("Pushed {image}")),
        "{}",
        text(&out.stdout)
    );

    let out = run(&[
        "validate",
        "--pull",
        &image,
        "--config",
        "simple-config.yaml",
        "--plain-http",
        &host,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "Package validated: 2 phases, 3 objects."
    );

    let from_dir = run(&["tree", "simple", "--config", "simple-config.yaml"]);
    let from_image = run(&[
        "tree",
        "--pull",
        &image,
        "--config",
        "simple-config.yaml",
        "--plain-http",
        &host,
    ]);
    assert_eq!(text(&from_dir.stdout), text(&from_image.stdout));
    assert!(text(&from_image.stdout).contains("apps/v1 Deployment simple-ns/simple"));
}

#[test]
fn broken_packages_are_not_pushed_and_unknown_images_are_reported() {
    let host = pko_testenv::shared().unwrap().registry().host();
    let image = format!("{host}/packages/broken:v1");
    let out = run(&[
        "build",
        "missing-gvk",
        "--push",
        &image,
        "--plain-http",
        &host,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let out = run(&["validate", "--pull", &image, "--plain-http", &host]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
}
