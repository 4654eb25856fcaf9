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

/// The digest `validate --pull` reports for `image` (stderr: `pulled <image> (<digest>)`).
fn pulled_digest(image: &str, host: &str, extra: &[&str]) -> String {
    let mut args = vec!["validate", "--pull", image, "--plain-http", host];
    args.extend_from_slice(extra);
    let out = run(&args);
    let stderr = text(&out.stderr);
    stderr
        .split_once(&format!("pulled {image} ("))
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(digest, _)| digest.to_owned())
        .unwrap_or_else(|| panic!("no digest in: {stderr}"))
}

#[test]
fn update_locks_the_digests_of_the_manifest_images() {
    let host = pko_testenv::shared().unwrap().registry().host();
    let app = format!("{host}/apps/app:v1");
    let push = |package: &str, config: &[&str]| {
        let mut args = vec!["build", package, "--push", &app, "--plain-http", &host];
        args.extend_from_slice(config);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    };
    push("simple", &["--config", "simple-config.yaml"]);

    // The `images` example, pointed at the image just pushed, without its lock.
    let dir = std::env::temp_dir().join(format!("pko-update-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let packages = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packages/images");
    let manifest = std::fs::read_to_string(packages.join("manifest.yaml"))
        .unwrap()
        .replace("registry.example/team/app:v1", &app);
    std::fs::write(dir.join("manifest.yaml"), manifest).unwrap();
    std::fs::copy(
        packages.join("pinned.yaml.gotmpl"),
        dir.join("pinned.yaml.gotmpl"),
    )
    .unwrap();
    let dir_arg = dir.to_str().unwrap();

    let out = run(&["validate", dir_arg]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    let out = run(&["update", dir_arg, "--plain-http", &host]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lock_path = dir.join("manifest.lock.yaml");
    assert_eq!(
        text(&out.stdout).trim(),
        format!("Updated {} (1 images)", lock_path.display())
    );
    let digest = pulled_digest(&app, &host, &["--config", "simple-config.yaml"]);
    let lock = std::fs::read_to_string(&lock_path).unwrap();
    assert!(lock.contains(&digest), "{lock}");
    let out = run(&["validate", dir_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run(&["update", dir_arg, "--plain-http", &host]);
    assert_eq!(
        text(&out.stdout).trim(),
        format!("{} is up to date", lock_path.display())
    );

    // The tag moves: update follows it.
    push("handlebars", &[]);
    let moved = pulled_digest(&app, &host, &[]);
    assert_ne!(moved, digest);
    let out = run(&["update", dir_arg, "--plain-http", &host]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&lock_path)
        .unwrap()
        .contains(&moved));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The OCI layout `build --output` writes is a standard one: skopeo copies it into the registry, and the
/// copy pulls and renders like the directory.
#[test]
fn oci_layouts_copy_into_a_registry_with_skopeo() {
    let host = pko_testenv::shared().unwrap().registry().host();
    let tar = std::env::temp_dir().join(format!("pko-skopeo-{}.tar", std::process::id()));
    let tar_arg = tar.to_str().unwrap();
    let out = run(&[
        "build",
        "handlebars",
        "--output",
        tar_arg,
        "--tag",
        "handlebars:v1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let image = format!("{host}/layouts/handlebars:v1");
    let copied = Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{tar_arg}"))
        .arg(format!("docker://{image}"))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied.stderr));
    let pulled = run(&["tree", "--pull", &image, "--plain-http", &host]);
    assert_eq!(pulled.status.code(), Some(0), "{}", text(&pulled.stderr));
    assert_eq!(
        text(&pulled.stdout),
        text(&run(&["tree", "handlebars"]).stdout)
    );
    std::fs::remove_file(&tar).unwrap();
}
