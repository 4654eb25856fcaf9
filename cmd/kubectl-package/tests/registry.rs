//! `build --push`, `validate --pull` and `update` against the real registry of the test environment, with
//! upstream's flags and outputs.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oci_client::secrets::RegistryAuth;
use pko_actors::package::image::ImageStore;

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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn host() -> String {
    pko_testenv::shared().unwrap().registry().host()
}

/// The digest the registry holds for `image`.
fn registry_digest(image: &str) -> String {
    let store = ImageStore::new(vec![host()]);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store.resolve_digest(image, &RegistryAuth::Anonymous))
        .unwrap()
}

#[test]
fn built_images_push_to_every_tag_and_validate_when_pulled() {
    let host = host();
    let (a, b) = (
        format!("{host}/packages/simple:v1"),
        format!("{host}/packages/simple:stable"),
    );
    let out = run(&[
        "build",
        "-t",
        &format!("{a},{b}"),
        "--push",
        "--insecure",
        "simple",
    ]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(text(&out.stdout), "Package built successfully!");
    assert_eq!(registry_digest(&a), registry_digest(&b));

    // --output-format digest prints only the digest, and it is the pushed one.
    let c = format!("{host}/packages/handlebars:v1");
    let out = run(&[
        "build",
        "-t",
        &c,
        "--push",
        "--output-format",
        "digest",
        "--plain-http",
        &host,
        "handlebars",
    ]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(text(&out.stdout), format!("{}\n", registry_digest(&c)));

    let out = run(&["validate", "--pull", &a, "--insecure"]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(text(&out.stdout), "Package validated successfully!");
}

#[test]
fn broken_packages_are_not_pushed_and_missing_images_are_reported() {
    let host = host();
    let image = format!("{host}/packages/broken:v1");
    let out = run(&["build", "-t", &image, "--push", "--insecure", "missing-gvk"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with("Error: building from source: loading package from files: "),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["validate", "--pull", &image, "--insecure"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with(
            "Error: validating package: getting package from remote reference: importing package from image: "
        ),
        "{}",
        text(&out.stderr)
    );
}

/// The `images` example pointed at `image`, in a temporary directory, without a lock.
fn images_package(image: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pko-update-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let example = packages().join("images");
    let manifest = std::fs::read_to_string(example.join("manifest.yaml"))
        .unwrap()
        .replace("registry.example/team/app:v1", image);
    std::fs::write(dir.join("manifest.yaml"), manifest).unwrap();
    std::fs::copy(
        example.join("pinned.yaml.gotmpl"),
        dir.join("pinned.yaml.gotmpl"),
    )
    .unwrap();
    dir
}

fn push(image: &str, package: &str) {
    let out = run(&["build", "-t", image, "--push", "--insecure", package]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn update_locks_digests_and_build_checks_them_on_the_registry() {
    let host = host();
    let app = format!("{host}/apps/app:v1");
    push(&app, "handlebars");
    let dir = images_package(&app, "lock");
    let path = dir.to_str().unwrap();

    let out = run(&["validate", path]);
    assert_eq!(
        text(&out.stderr),
        "Error: validating package: loading package from files: Missing image in manifest.lock.yaml, but using PackageManifest.spec.images. Try running: kubectl package update in manifest.lock.yaml\n"
    );

    let out = run(&["update", "--insecure", path]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(text(&out.stdout), "Package updated successfully!\n");
    let lock = std::fs::read_to_string(dir.join("manifest.lock.yaml")).unwrap();
    let digest = registry_digest(&app);
    let expected_tail =
        format!("spec:\n  images:\n  - digest: {digest}\n    image: {app}\n    name: app\n");
    assert!(
        lock.starts_with("apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifestLock\nmetadata:\n  creationTimestamp: \"")
            && lock.ends_with(&expected_tail),
        "{lock}"
    );
    let out = run(&["update", "--insecure", path]);
    assert_eq!(text(&out.stdout), "Package is already up-to-date\n");
    assert_eq!(
        std::fs::read_to_string(dir.join("manifest.lock.yaml")).unwrap(),
        lock,
        "left untouched"
    );
    let out = run(&["validate", path]);
    assert_eq!(text(&out.stdout), "Package validated successfully!");
    // build looks every locked digest up on its registry.
    let out = run(&["build", "--insecure", path]);
    assert_eq!(
        text(&out.stdout),
        "Package built successfully!",
        "{}",
        text(&out.stderr)
    );

    // The tag moves: update follows it, and a lock naming a digest the registry lacks fails build.
    push(&app, "multi-component");
    let moved = registry_digest(&app);
    assert_ne!(moved, digest);
    let out = run(&["update", "--insecure", path]);
    assert_eq!(text(&out.stdout), "Package updated successfully!\n");
    let lock = std::fs::read_to_string(dir.join("manifest.lock.yaml")).unwrap();
    assert!(lock.contains(&moved), "{lock}");
    let missing = format!("sha256:{}", "0".repeat(64));
    std::fs::write(
        dir.join("manifest.lock.yaml"),
        lock.replace(&moved, &missing),
    )
    .unwrap();
    let out = run(&["build", "--insecure", path]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("Error: building from source: loading package from files: ")
            && stderr.ends_with(&format!(": image \"app\" digest error (\"{missing}\")\n")),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let out = run(&["update", "--insecure", "does-not-exist"]);
    assert!(
        text(&out.stderr).starts_with("Error: generating lock data: loading package: "),
        "{}",
        text(&out.stderr)
    );
    let unknown = images_package(&format!("{host}/apps/nowhere:v1"), "unknown");
    let out = run(&["update", "--insecure", unknown.to_str().unwrap()]);
    assert!(
        text(&out.stderr).starts_with(&format!(
            "Error: generating lock data: resolving lock image for \"{host}/apps/nowhere:v1\": resolving image digest: "
        )),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&unknown).unwrap();
}

/// The tarball `build -o` writes is a standard OCI layout too: skopeo copies it into the registry, and
/// the copy validates when pulled.
#[test]
fn tarballs_copy_into_a_registry_with_skopeo() {
    let host = host();
    let tar = std::env::temp_dir().join(format!("pko-skopeo-{}.tar", std::process::id()));
    let tar_arg = tar.to_str().unwrap();
    let out = run(&["build", "-t", "handlebars:v1", "-o", tar_arg, "handlebars"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let image = format!("{host}/layouts/handlebars:v1");
    let copied = Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{tar_arg}"))
        .arg(format!("docker://{image}"))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied.stderr));
    let pulled = run(&["validate", "--pull", &image, "--insecure"]);
    assert_eq!(
        text(&pulled.stdout),
        "Package validated successfully!",
        "{}",
        text(&pulled.stderr)
    );
    std::fs::remove_file(Path::new(&tar)).unwrap();
}
