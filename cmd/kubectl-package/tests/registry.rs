//! `build --push`, `validate --pull` and `update` against the real registry of the test environment, with
//! upstream's flags and outputs.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{packages, run, run_in, scratch, text};
use oci_client::secrets::RegistryAuth;
use pko_package::image::ImageStore;

fn host() -> String {
    pko_testenv::shared_registries().unwrap().open.host()
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
    // An image with no package files in it.
    let empty = format!("{host}/packages/empty:v1");
    let files: pko_package::files::PackageFiles =
        [("README.md".to_owned(), b"not a package".to_vec())].into();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(ImageStore::new(vec![host.clone()]).push_under(
            &empty,
            &files,
            "docs/",
            &Default::default(),
            &RegistryAuth::Anonymous,
        ))
        .unwrap();
    let out = run(&["validate", "--pull", &empty, "--insecure"]);
    assert_eq!(
        text(&out.stderr),
        "Error: validating package: Package image contains no files. Might be corrupted.\n"
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

#[test]
fn repository_indexes_take_package_versions_and_travel_as_images() {
    let host = host();
    let dir = scratch("repository");
    let package = format!("{host}/repo/simple:v1");
    push(&package, "simple");
    let repo = |args: &[&str]| {
        let mut all = vec!["repository"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--plain-http", &host]);
        let out = run_in(&dir, &all);
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let ok = (Some(0), String::new(), String::new());
    let err = |m: &str| (Some(1), String::new(), format!("Error: {m}\n"));

    assert_eq!(
        repo(&["init", "index.yaml", ""]),
        err("arguments invalid: name must be not empty")
    );
    assert_eq!(
        repo(&["init", "", "main"]),
        err("arguments invalid: file must be not empty")
    );
    assert_eq!(repo(&["init", "index.yaml", "main"]), ok);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("index.yaml"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(
        repo(&["add", "index.yaml", &package, "1.0.0", "v1.1.0"]),
        ok
    );
    let index = std::fs::read_to_string(dir.join("index.yaml")).unwrap();
    let digest = registry_digest(&package);
    let hex = digest.trim_start_matches("sha256:");
    assert!(index.contains("kind: RepositoryEntry"), "{index}");
    assert!(
        index.contains(&format!("image: {host}/repo/simple\n")),
        "{index}"
    );
    assert!(index.contains(&format!("digest: {hex}\n")), "{index}");
    assert!(
        index.contains("- v1.1.0\n") && index.find("v1.1.0") < index.find("v1.0.0"),
        "{index}"
    );
    assert!(index.contains("name: simple\n"), "{index}");

    assert_eq!(
        repo(&["add", "index.yaml", &package, "1.0.0"]),
        err("add new entry: package \"simple\" version \"v1.0.0\" already exists")
    );
    assert_eq!(
        repo(&["add", "index.yaml", "simple:v1", "1.0.0"]),
        err("package reference: could not parse reference: simple:v1")
    );
    assert!(repo(&["add", "index.yaml", &package, "one"])
        .2
        .starts_with("Error: version: "));
    assert_eq!(
        repo(&["add", "nope.yaml", &package, "2.0.0"]),
        err("open nope.yaml: no such file or directory")
    );
    assert_eq!(
        repo(&["add", "index.yaml", &package]),
        err("requires at least 3 arg(s), only received 2")
    );

    // The index travels as an image and comes back unchanged.
    let index_image = format!("{host}/repo/index:v1");
    assert_eq!(repo(&["push", "index.yaml", &index_image]), ok);
    assert_eq!(repo(&["pull", "copy.yaml", &index_image]), ok);
    assert_eq!(
        std::fs::read_to_string(dir.join("copy.yaml")).unwrap(),
        index
    );

    assert_eq!(repo(&["remove", "index.yaml", &package]), ok);
    let index = std::fs::read_to_string(dir.join("index.yaml")).unwrap();
    assert!(!index.contains("RepositoryEntry"), "{index}");
    assert!(repo(&["remove", "index.yaml", &package])
        .2
        .starts_with("Error: add new entry: "));
    // `repo` is the alias.
    let out = run_in(&dir, &["repo", "init", "again.yaml", "x"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kickstart_imports_an_olm_bundle_image() {
    let host = host();
    let dir = scratch("olm");
    let image = format!("{host}/bundles/op:v1");
    let csv = "apiVersion: operators.coreos.com/v1alpha1\nkind: ClusterServiceVersion\nmetadata:\n  name: op.v1\n  annotations: {operatorframework.io/suggested-namespace: op-ns}\nspec:\n  install:\n    strategy: deployment\n    spec:\n      deployments:\n      - name: op\n        spec:\n          selector: {matchLabels: {app: op}}\n          template:\n            metadata: {labels: {app: op}}\n            spec:\n              serviceAccountName: op\n              containers: [{name: op, image: quay.io/op:1}]\n      clusterPermissions:\n      - serviceAccountName: op\n        rules: [{apiGroups: [\"\"], resources: [nodes], verbs: [list]}]\n";
    let files: pko_package::files::PackageFiles = [
        (
            "metadata/annotations.yaml",
            "annotations:\n  operators.operatorframework.io.bundle.package.v1: op\n".to_owned(),
        ),
        ("manifests/op.clusterserviceversion.yaml", csv.to_owned()),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.into_bytes()))
    .collect();
    let store = ImageStore::new(vec![host.clone()]);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store.push_under(
            &image,
            &files,
            "",
            &Default::default(),
            &RegistryAuth::Anonymous,
        ))
        .unwrap();

    let out = run_in(
        &dir,
        &[
            "kickstart",
            "from-bundle",
            "-b",
            &image,
            "--plain-http",
            &host,
        ],
    );
    assert_eq!(text(&out.stderr), "");
    assert_eq!(
        text(&out.stdout),
        "Kickstarted the \"op\" package with 4 objects."
    );
    let manifest = std::fs::read_to_string(dir.join("from-bundle/manifest.yaml")).unwrap();
    assert!(manifest.contains("\n  name: op\n"), "{manifest}");
    for file in [
        "deploy/op.deployment.yaml",
        "rbac/op.serviceaccount.yaml",
        "rbac/op-op-cluster-0.clusterrole.yaml",
        "rbac/op-op-cluster-0.clusterrolebinding.yaml",
        "namespaces/op-ns.namespace.yaml",
    ] {
        assert!(dir.join("from-bundle").join(file).exists(), "{file}");
    }
    let out = run_in(&dir, &["validate", "from-bundle"]);
    assert_eq!(
        text(&out.stdout),
        "Package validated successfully!",
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Credentials come from where `docker login` leaves them: the config's `auths`, or a credential helper.
#[test]
fn credentials_come_from_the_docker_config_and_its_helpers() {
    let registry = &pko_testenv::shared_registries().unwrap().authenticated;
    let host = registry.host();
    let (user, password) = registry.credentials().unwrap();
    let dir = scratch("docker-config");
    let image = format!("{host}/private/handlebars:v1");
    let build = |envs: &[(&str, String)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kubectl-package"));
        command
            .args(["build", "-t", &image, "--push", "--insecure", "handlebars"])
            .current_dir(packages())
            .env_remove("PKO_REGISTRY_USERNAME")
            .env_remove("PKO_REGISTRY_PASSWORD")
            .env("HOME", &dir)
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("XDG_RUNTIME_DIR");
        for (k, v) in envs {
            command.env(k, v);
        }
        command.output().unwrap()
    };

    // Anonymous: refused.
    let out = build(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("access denied"),
        "{}",
        text(&out.stderr)
    );

    // `auths` in ~/.docker/config.json.
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    std::fs::create_dir_all(dir.join(".docker")).unwrap();
    std::fs::write(
        dir.join(".docker/config.json"),
        format!(r#"{{"auths": {{"{host}": {{"auth": "{token}"}}}}}}"#),
    )
    .unwrap();
    let out = build(&[]);
    assert_eq!(
        text(&out.stdout),
        "Package built successfully!",
        "{}",
        text(&out.stderr)
    );

    // A credential helper named by credHelpers, in $DOCKER_CONFIG.
    let helper_dir = dir.join("bin");
    std::fs::create_dir_all(&helper_dir).unwrap();
    let helper = helper_dir.join("docker-credential-pkotest");
    std::fs::write(
        &helper,
        format!("#!/bin/sh\nread host\n[ \"$host\" = \"{host}\" ] || exit 1\necho '{{\"Username\": \"{user}\", \"Secret\": \"{password}\"}}'\n"),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = dir.join("helper-config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        format!(r#"{{"credHelpers": {{"{host}": "pkotest"}}}}"#),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        helper_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = build(&[
        ("DOCKER_CONFIG", config.display().to_string()),
        ("PATH", path),
    ]);
    assert_eq!(
        text(&out.stdout),
        "Package built successfully!",
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
