//! `kubectl-package` against upstream's command-line contract, table-driven over the example packages in
//! `tests/packages/`: every command and flag, exit codes, byte-exact stdout (trees, success lines) and
//! stderr (`Error: <message>\n`), and the template-test fixtures (compare, report, generate).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{packages, run, run_in, scratch, text};

/// What a case expects on one stream.
enum Expect {
    Exactly(&'static str),
    Empty,
    Contains(&'static str),
}

impl Expect {
    fn check(&self, what: &str, actual: &str, case: &[&str]) {
        match self {
            Expect::Exactly(want) => assert_eq!(actual, *want, "{what} of {case:?}"),
            Expect::Empty => assert_eq!(actual, "", "{what} of {case:?}"),
            Expect::Contains(want) => {
                assert!(actual.contains(want), "{what} of {case:?}: {actual}")
            }
        }
    }
}

/// (args, exit code, stdout, stderr)
type Case = (&'static [&'static str], i32, Expect, Expect);

fn check_all(cases: &[Case]) {
    for (args, code, stdout, stderr) in cases {
        let out = run(args);
        stdout.check("stdout", &text(&out.stdout), args);
        stderr.check("stderr", &text(&out.stderr), args);
        assert_eq!(out.status.code(), Some(*code), "exit code of {args:?}");
    }
}

const SIMPLE_NAMESPACED: &str = "\
simple
Package team-a/test
└── Phase deploy
    └── apps/v1, Kind=Deployment team-a/test
    └── /v1, Kind=ConfigMap team-a/test-settings
";

const SIMPLE_CLUSTER: &str = "\
simple
ClusterPackage /test-cluster
└── Phase namespace
│   ├── /v1, Kind=Namespace /test-cluster-ns
└── Phase deploy
    └── apps/v1, Kind=Deployment test-cluster-ns/test-cluster
    └── /v1, Kind=ConfigMap test-cluster-ns/test-cluster-settings
";

#[test]
fn tree_prints_upstream_trees_byte_for_byte() {
    use Expect::*;
    check_all(&[
        // The first test template's metadata and config.
        (&["tree", "simple"], 0, Exactly(SIMPLE_NAMESPACED), Empty),
        (&["tree", "simple", "--config-testcase", "cluster"], 0, Exactly(SIMPLE_CLUSTER), Empty),
        (&["tree", "--config-testcase=cluster", "simple"], 0, Exactly(SIMPLE_CLUSTER), Empty),
        // --cluster keeps the first case's name, forces namespace "".
        (
            &["tree", "--cluster", "simple"],
            0,
            Exactly("simple\nClusterPackage /test\n└── Phase namespace\n│   ├── /v1, Kind=Namespace /test-ns\n└── Phase deploy\n    └── apps/v1, Kind=Deployment test-ns/test\n    └── /v1, Kind=ConfigMap test-ns/test-settings\n"),
            Empty,
        ),
        // Without test templates: name `name`, namespace `namespace`; objects sorted by path.
        (
            &["tree", "handlebars"],
            0,
            Exactly("handlebars\nPackage namespace/name\n└── Phase config\n│   ├── /v1, Kind=ConfigMap /name-settings\n└── Phase app\n    └── /v1, Kind=ConfigMap /name-region-eu\n    └── /v1, Kind=ConfigMap /name-region-us\n"),
            Empty,
        ),
        // Multi-component: the root only; --component is accepted and ignored.
        (
            &["tree", "multi-component", "--component", "backend"],
            0,
            Exactly("multi-component\nPackage namespace/name\n└── Phase main\n    └── /v1, Kind=ConfigMap /multi-component-root\n"),
            Empty,
        ),
        // A phase without objects is left out; no objects at all: the header only.
        (
            &["tree", "--cluster", "cluster-only"],
            0,
            Exactly("cluster-only\nClusterPackage /name\n└── Phase crds\n    └── /v1, Kind=Namespace /cluster-only\n"),
            Empty,
        ),
        (&["tree", "empty-package"], 0, Exactly("empty-package\nPackage namespace/name\n"), Empty),
        // Config from a file: pruned and defaulted; CEL filtering follows it.
        (
            &["tree", "required-config", "--config-path", "required-config-values.yaml"],
            0,
            Exactly("required-config\nPackage namespace/name\n└── Phase main\n    └── /v1, Kind=ConfigMap namespace/name\n"),
            Empty,
        ),
        (
            &["tree", "required-config", "--config-path", "required-config-values.json"],
            0,
            Exactly("required-config\nPackage namespace/name\n└── Phase main\n    └── /v1, Kind=ConfigMap namespace/name\n"),
            Empty,
        ),
        (
            &["tree", "cel-filtering", "--config-path", "cel-filtering-ha.yaml"],
            0,
            Exactly("cel-filtering\nPackage namespace/name\n└── Phase main\n    └── /v1, Kind=ConfigMap /app\n    └── /v1, Kind=ConfigMap /ha-budget\n"),
            Empty,
        ),
        // A mapping key given twice: the last wins, as upstream's YAML library does.
        (
            &["tree", "duplicate-key"],
            0,
            Exactly("duplicate-key\nPackage namespace/name\n└── Phase main\n    └── /v1, Kind=ConfigMap /name-settings\n"),
            Empty,
        ),
    ]);
}

#[test]
fn tree_errors_are_upstreams() {
    use Expect::*;
    check_all(&[
        (
            &["tree", "required-config"],
            1,
            Empty,
            Exactly("Error: rendering package: [spec.config.size: Required value, spec.config.owner: Required value]\n"),
        ),
        // An unknown test case falls back to the defaults; the schema then rejects the empty config.
        (
            &["tree", "simple", "--config-testcase", "nope"],
            1,
            Empty,
            Exactly("Error: rendering package: spec.config.replicas: Required value\n"),
        ),
        (
            &["tree", "missing-scopes"],
            1,
            Empty,
            Exactly("Error: rendering package: parsing package contents: spec.scopes: Required value\nPackage unsupported scope in manifest.yaml\n"),
        ),
        (
            &["tree", "cluster-only"],
            1,
            Empty,
            Exactly("Error: rendering package: parsing package contents: Package unsupported scope in manifest.yaml\n"),
        ),
        (
            &["tree", "simple", "--config-path", "nope.yaml"],
            1,
            Empty,
            Exactly("Error: getting config: read config from file: open nope.yaml: no such file or directory\n"),
        ),
        (
            &["tree", "simple", "--config-path", "x", "--config-testcase", ""],
            1,
            Empty,
            Exactly("Error: if any flags in the group [config-path config-testcase] are set none of the others can be; [config-path config-testcase] were all set\n"),
        ),
        (
            &["tree", "no-manifest"],
            1,
            Empty,
            Exactly("Error: rendering package: PackageManifest not found: searched at manifest.yaml and manifest.yml\n"),
        ),
    ]);
}

#[test]
fn validate_reports_success_and_upstreams_messages() {
    use Expect::*;
    const OK: Expect = Exactly("Package validated successfully!");
    check_all(&[
        (&["validate", "handlebars"], 0, OK, Empty),
        (&["validate", "multi-component"], 0, OK, Empty),
        (&["validate", "images"], 0, OK, Empty),
        // Its committed fixtures hold `image: ''` where the Package has no annotations.
        (&["validate", "lazy-image"], 0, OK, Empty),
        // No test templates: templates are never rendered, so neither required config nor a missing
        // key fails validate (tree renders and fails them).
        (&["validate", "required-config"], 0, OK, Empty),
        (&["validate", "missing-key"], 0, OK, Empty),
        (&["validate", "cluster-only"], 0, OK, Empty),
        (
            &["validate", "missing-phase-annotation"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: loading package from files: Missing package-operator.run/phase Annotation in objects.yaml idx 1\n"),
        ),
        (
            &["validate", "duplicate-object"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: loading package from files: Duplicate Object in b.yaml idx 0\n"),
        ),
        (
            &["validate", "invalid-label"],
            1,
            Empty,
            Contains("Error: validating package: loading package from files: loading package from files: Labels invalid in objects.yaml idx 0: metadata.labels: Invalid value: \"bad key!\": name part must consist of alphanumeric characters"),
        ),
        (
            &["validate", "missing-gvk"],
            1,
            Empty,
            Contains("Invalid YAML in objects.yaml idx 0: error unmarshaling JSON: while decoding JSON: Object 'Kind' is missing in '{\"metadata\":{\"annotations\":{\"package-operator.run/phase\":\"deploy\"},\"name\":\"no-kind\"}}'\n# a comment line\nmetadata:"),
        ),
        (
            &["validate", "empty-kind"],
            1,
            Empty,
            Contains("Invalid YAML in objects.yaml idx 0: error unmarshaling JSON: while decoding JSON: Object 'Kind' is missing in '{\"apiVersion\":\"v1\",\"kind\":null,"),
        ),
        (
            &["validate", "missing-scopes"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: spec.scopes: Required value\n"),
        ),
        (
            &["validate", "invalid-test-config"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: test.template[0].context.config.size: Required value\n"),
        ),
        (
            &["validate", "missing-lock"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: Missing image in manifest.lock.yaml, but using PackageManifest.spec.images. Try running: kubectl package update in manifest.lock.yaml\n"),
        ),
        (
            &["validate", "invalid-lock"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: PackageManifestLock invalid in manifest.lock.yaml: spec.images[0].digest: Required value\n"),
        ),
        (
            &["validate", "broken-component"],
            1,
            Empty,
            Exactly("Error: validating package: loading package from files: component \"bad\": loading package from files: Missing package-operator.run/phase Annotation in objects.yaml idx 0\n"),
        ),
        (
            &["validate", "two-manifests"],
            1,
            Empty,
            Exactly("Error: validating package: PackageManifest present multiple times\n"),
        ),
        (
            &["validate", "unknown-gvk"],
            1,
            Empty,
            Exactly("Error: validating package: unknown GVK in manifest.yaml: GroupKind must be PackageManifest.manifests.package-operator.run, is: Bread.banana\n"),
        ),
        (
            &["validate", "nested-components"],
            1,
            Empty,
            Exactly("Error: validating package: Nesting multi-component packages not allowed [inner]\n"),
        ),
        (
            &["validate", "file-in-components"],
            1,
            Empty,
            Exactly("Error: validating package: The components directory may only contain folders and dot files in components/README.md\n"),
        ),
        (
            &["validate", "does-not-exist"],
            1,
            Empty,
            Exactly("Error: validating package: importing package from folder: walk source dir: access file .: stat .: no such file or directory\n"),
        ),
        (&["validate", ""], 1, Empty, Exactly("Error: arguments invalid: 'target' must not be empty\n")),
    ]);
}

/// The shared messages of `expected-errors.txt` (also asserted on Packages by the manager's tests), as
/// `tree` reports them.
#[test]
fn broken_examples_fail_tree_with_the_shared_messages() {
    let listed = std::fs::read_to_string(packages().join("expected-errors.txt")).unwrap();
    let cases: Vec<(&str, &str)> = listed
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_once('\t').unwrap())
        // tree never looks at components.
        .filter(|(example, _)| *example != "broken-component")
        .collect();
    assert_eq!(cases.len(), 10);
    for (example, message) in cases {
        let out = run(&["tree", example]);
        assert_eq!(out.status.code(), Some(1), "{example}");
        let stderr = text(&out.stderr);
        let structural = format!("Error: rendering package: {message}");
        let parsed = format!("Error: rendering package: parsing package contents: {message}");
        assert!(
            stderr.starts_with(&parsed) || stderr.starts_with(&structural),
            "{example}: {stderr}"
        );
    }
}

#[test]
fn usage_follows_cobra_and_pflag() {
    use Expect::*;
    check_all(&[
        (&[], 0, Contains("Usage: kubectl-package"), Empty),
        (&["rollout"], 0, Contains("Usage: kubectl-package rollout"), Empty),
        (&["tree", "--help"], 0, Contains("--config-testcase"), Empty),
        (&["version"], 0, Contains("pko\tv"), Empty),
        (&["completion", "bash"], 0, Contains("_kubectl__package()"), Empty),
        (&["completion", "zsh"], 0, Contains("#compdef kubectl-package"), Empty),
        (&["completion", "fish"], 0, Contains("complete -c kubectl-package"), Empty),
        (&["completion", "powershell"], 0, Contains("Register-ArgumentCompleter"), Empty),
        (
            &["completion", "tcsh"],
            1,
            Empty,
            Exactly("Error: unknown command \"tcsh\" for \"kubectl-package completion\"\n"),
        ),
        (&["-v"], 0, Contains("kubectl-package version v"), Empty),
        (&["version", "x"], 1, Empty, Exactly("Error: accepts 0 arg(s), received 1\n")),
        (&["version", "--nope"], 1, Empty, Exactly("Error: unknown flag: --nope\n")),
        (&["tree"], 1, Empty, Exactly("Error: accepts 1 arg(s), received 0\n")),
        (&["validate", "a", "b"], 1, Empty, Exactly("Error: accepts 1 arg(s), received 2\n")),
        (&["build", "--output /some/dir"], 1, Empty, Exactly("Error: unknown flag: --output /some/dir\n")),
        (&["tree", "-x", "simple"], 1, Empty, Exactly("Error: unknown shorthand flag: 'x' in -x\n")),
        (&["build", "simple", "--tag"], 1, Empty, Exactly("Error: flag needs an argument: --tag\n")),
        (
            &["rollout", "history", "a", "b", "c"],
            1,
            Empty,
            Exactly("Error: accepts between 1 and 2 arg(s), received 3\n"),
        ),
        (
            &["rollout", "history", "package/x", "--revision", "one"],
            1,
            Empty,
            Exactly("Error: invalid argument \"one\" for \"--revision\" flag: strconv.ParseInt: parsing \"one\": invalid syntax\n"),
        ),
        (
            &["rollout", "history", "package"],
            1,
            Empty,
            Exactly("Error: arguments invalid: arguments in resource/name form must have a single resource and name\n"),
        ),
        (&["rollout", "history", "widget", "x", "-n", "a"], 1, Empty, Exactly("Error: invalid resource type\n")),
        (
            &["rollout", "history", "package/x", "-o", "table"],
            1,
            Empty,
            Exactly("Error: invalid output format: \"table\"\n"),
        ),
        (
            &["clustertree", "package", "x"],
            1,
            Empty,
            Exactly("Error: --namespace is required as its a namespaced Resource type\n"),
        ),
        (
            &["pause", "objectdeployment", "x"],
            1,
            Empty,
            Exactly("Error: invalid resource name: expected `clusterpackage`/`package`, got `objectdeployment`\n"),
        ),
        (
            &["nope"],
            1,
            Empty,
            Exactly("Error: unknown command \"nope\" for \"kubectl-package\"\nRun 'kubectl-package --help' for usage.\n"),
        ),
        // Global flags are accepted by every command.
        (&["tree", "--zap-log-level=info", "--kubeconfig", "/dev/null", "empty-package"], 0, Exactly("empty-package\nPackage namespace/name\n"), Empty),
    ]);
}

#[test]
fn build_checks_its_arguments_in_upstreams_order() {
    use Expect::*;
    check_all(&[
        (&["build", ""], 1, Empty, Exactly("Error: arguments invalid: source path empty\n")),
        (
            &["build", "--push", "simple"],
            1,
            Empty,
            Exactly("Error: arguments invalid: output or push is requested but no tags are set\n"),
        ),
        (
            &["build", "-o", "x.tar", "simple"],
            1,
            Empty,
            Exactly("Error: arguments invalid: output or push is requested but no tags are set\n"),
        ),
        (
            &["build", "-t", "Bad:Tag!", "simple"],
            1,
            Empty,
            Contains("Error: invalid tag specified as parameter Bad:Tag!: "),
        ),
        (&["build", "-t", "a", "-l", "k=", "simple"], 1, Empty, Exactly("Error: parsing label \"k\", value is empty\n")),
        (
            &["build", "-t", "a", "-l", "novalue", "simple"],
            1,
            Empty,
            Exactly("Error: invalid argument \"novalue\" for \"-l, --label\" flag: novalue must be formatted as key=value\n"),
        ),
        (&["build", "-t", "a", "--output-format", "yaml", "simple"], 1, Empty, Exactly("Error: unknown output format: yaml\n")),
        (&["update", ""], 1, Empty, Exactly("Error: arguments invalid: target path empty\n")),
        (
            &["update", "with-dependencies"],
            1,
            Empty,
            Exactly("Error: generating lock data: spec.dependencies: locking package dependencies is not supported by pko yet\n"),
        ),
        // Without --push and -o, build is validation (no registry needed without a lock).
        (&["build", "handlebars"], 0, Exactly("Package built successfully!"), Empty),
        (&["build", "-t", "test", "--output-format", "digest", "handlebars"], 0, Empty, Empty),
        (
            &["build", "missing-phase-annotation"],
            1,
            Empty,
            Exactly("Error: building from source: loading package from files: loading package from files: Missing package-operator.run/phase Annotation in objects.yaml idx 1\n"),
        ),
    ]);
}

/// A private copy of an example package, subdirectories included (tests edit it).
fn copy_example(example: &str, tag: &str) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
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
    let dir = std::env::temp_dir().join(format!("pko-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy(&packages().join(example), &dir);
    dir
}

#[test]
fn fixtures_are_compared_reported_and_generated_per_test_case() {
    let dir = copy_example("simple", "fixtures");
    let path = dir.to_str().unwrap();
    let validate = || run(&["validate", path]);
    let fixtures = dir.join(".test-fixtures");

    // The committed fixtures match.
    let out = validate();
    assert_eq!(text(&out.stderr), "");
    assert_eq!(text(&out.stdout), "Package validated successfully!");

    // A changed fixture: diff -u, labelled as upstream labels it.
    let deployment = fixtures.join("namespaced/deployment.yaml");
    let original = std::fs::read_to_string(&deployment).unwrap();
    std::fs::write(&deployment, original.replace("replicas: 2", "replicas: 5")).unwrap();
    let out = validate();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("Error: validating package: loading package from files: File mismatch against fixture in deployment.yaml: Testcase \"namespaced\"\n--- FIXTURE/deployment.yaml\n+++ ACTUAL/deployment.yaml\n@@ "),
        "{stderr}"
    );
    assert!(
        stderr.contains("\n-  replicas: 5\n+  replicas: 2\n"),
        "{stderr}"
    );
    std::fs::write(&deployment, &original).unwrap();

    // A fixture for a file that renders to nothing for this case.
    std::fs::write(fixtures.join("namespaced/namespace.yaml"), "x: 1\n").unwrap();
    let out = validate();
    assert_eq!(
        text(&out.stderr),
        "Error: validating package: loading package from files: file namespace.yaml should not exist, filtered or empty after template render\n"
    );
    std::fs::remove_file(fixtures.join("namespaced/namespace.yaml")).unwrap();

    // A file that renders but has no fixture: a hard error naming the fixture path.
    std::fs::remove_file(fixtures.join("cluster/namespace.yaml")).unwrap();
    let out = validate();
    assert_eq!(
        text(&out.stderr),
        format!(
            "Error: validating package: file {} not found in fixtures folder\n",
            fixtures.join("cluster/namespace.yaml").display()
        )
    );

    // A missing case directory is generated, and the case passes; nothing else is written.
    std::fs::remove_dir_all(fixtures.join("cluster")).unwrap();
    let out = validate();
    assert_eq!(
        text(&out.stdout),
        "Package validated successfully!",
        "{}",
        text(&out.stderr)
    );
    let committed = packages().join("simple/.test-fixtures/cluster");
    for file in ["deployment.yaml", "namespace.yaml"] {
        assert_eq!(
            std::fs::read_to_string(fixtures.join("cluster").join(file)).unwrap(),
            std::fs::read_to_string(committed.join(file)).unwrap(),
            "{file}"
        );
    }
    let mut written: Vec<String> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, ["cluster", "namespaced"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_test_case_name_cannot_write_outside_the_package() {
    let listing = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    // As fixture directories these would be the package directory itself, or one outside it.
    for (name, why) in [
        ("..", "must not be '.' or '..'"),
        ("../../escaped", "a valid config key must consist of"),
    ] {
        let dir = copy_example("simple", "escape");
        let manifest = dir.join("manifest.yaml");
        let original = std::fs::read_to_string(&manifest).unwrap();
        std::fs::write(
            &manifest,
            original.replace("- name: namespaced", &format!("- name: {name:?}")),
        )
        .unwrap();
        let before = listing(&dir);
        let out = run(&["validate", dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "test.template[0].name: Invalid value: {name:?}: {why}"
            )),
            "{stderr}"
        );
        assert_eq!(listing(&dir), before, "nothing written into the package");
        assert!(!dir.parent().unwrap().join("escaped").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn build_writes_a_tarball_that_docker_load_and_tree_read() {
    let out_dir = std::env::temp_dir().join(format!("pko-cli-build-{}", std::process::id()));
    let tar = out_dir.join("nested/dir/pkg.tar");
    let tar_arg = tar.to_str().unwrap();
    let out = run(&[
        "build",
        "-t",
        "handlebars:v1",
        "-t",
        "registry.example/handlebars:v1",
        "-o",
        tar_arg,
        "-l",
        "team=a",
        "handlebars",
    ]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(text(&out.stdout), "Package built successfully!");
    // Parent directories are created; the tar carries docker-save's manifest.json with the tags.
    let bytes = std::fs::read(&tar).unwrap();
    let listing = String::from_utf8_lossy(&bytes);
    assert!(
        listing.contains("\"RepoTags\":[\"handlebars:v1\",\"registry.example/handlebars:v1\"]"),
        "manifest.json with both tags"
    );
    assert!(
        listing.contains("\"Labels\":{\"team\":\"a\"}"),
        "config labels"
    );
    // pko reads its own tarballs too.
    let from_tar = run(&["tree", tar_arg]);
    assert_eq!(
        text(&from_tar.stdout),
        text(&run(&["tree", "handlebars"]).stdout)
    );
    std::fs::remove_dir_all(&out_dir).unwrap();
}

const OBJECTS: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  replicas: 3\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      nodeSelector: {disk: ssd}\n      containers:\n      - name: app\n        image: quay.io/shop/web:1\n        env: [{name: A, value: \"1\"}]\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n  namespace: shop\ndata:\n  motd: \"{{ literal braces }}\"\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n";

/// Serves `body` once over HTTP on a loopback port; returns the URL.
fn serve_once(body: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/objects.yaml", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request).unwrap();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
    });
    url
}

#[test]
fn kickstart_lays_out_a_package_that_validates_and_renders_its_input() {
    let dir = scratch("kickstart");
    std::fs::write(dir.join("objects.yaml"), OBJECTS).unwrap();
    let kickstarted =
        "[WARN] Some kinds don't have availability probes defined:\n- Widget.example.com\n";

    let out = run_in(&dir, &["kickstart", "plain", "-f", "objects.yaml"]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(
        text(&out.stdout),
        format!("Kickstarted the \"plain\" package with 3 objects.\n{kickstarted}")
    );
    let mut files = Vec::new();
    for phase in ["namespaces", "deploy", "other"] {
        for entry in std::fs::read_dir(dir.join("plain").join(phase)).unwrap() {
            files.push(format!(
                "{phase}/{}",
                entry.unwrap().file_name().to_string_lossy()
            ));
        }
    }
    files.sort();
    assert_eq!(
        files,
        [
            "deploy/web.configmap.yaml",
            "deploy/web.deployment.yaml",
            "namespaces/shop.namespace.yaml",
            "other/w.widget.yaml"
        ]
    );
    let out = run_in(&dir, &["validate", "plain"]);
    assert_eq!(
        text(&out.stdout),
        "Package validated successfully!",
        "{}",
        text(&out.stderr)
    );
    let plain_tree = text(&run_in(&dir, &["tree", "plain"]).stdout);
    assert_eq!(
        plain_tree,
        "plain\nPackage namespace/name\n└── Phase namespaces\n│   ├── /v1, Kind=Namespace /shop\n└── Phase deploy\n│   ├── /v1, Kind=ConfigMap shop/web\n│   ├── apps/v1, Kind=Deployment shop/web\n└── Phase other\n    └── example.com/v1, Kind=Widget /w\n"
    );

    // From stdin, parametrized: the defaults test case renders exactly the input objects.
    let out = pko_testenv::run_with_input(
        Command::new(env!("CARGO_BIN_EXE_kubectl-package"))
            .args([
                "kickstart",
                "templ",
                "-f",
                "-",
                "-p",
                "namespaces,replicas",
                "-p",
                "env,nodeselectors,resources,tolerations,nonsense",
            ])
            .current_dir(&dir),
        OBJECTS,
    )
    .unwrap();
    assert!(text(&out.stdout).starts_with("Kickstarted the \"templ\" package with 3 objects."));
    assert!(dir.join("templ/deploy/web.deployment.yaml.gotmpl").exists());
    let out = run_in(&dir, &["validate", "templ"]);
    assert_eq!(
        text(&out.stdout),
        "Package validated successfully!",
        "{}",
        text(&out.stderr)
    );
    for file in [
        "deploy/web.deployment.yaml",
        "deploy/web.configmap.yaml",
        "namespaces/shop.namespace.yaml",
    ] {
        let parse = |p: PathBuf| -> serde_json::Value {
            serde_saphyr::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        assert_eq!(
            parse(dir.join("templ/.test-fixtures/defaults").join(file)),
            parse(dir.join("plain").join(file)),
            "{file}"
        );
    }

    // From a URL; an existing folder and a pattern matching nothing fail.
    let url = serve_once(OBJECTS);
    let out = run_in(&dir, &["kickstart", "fetched", "-f", &url]);
    assert!(
        text(&out.stdout).starts_with("Kickstarted the \"fetched\" package with 3 objects."),
        "{}",
        text(&out.stderr)
    );
    let out = run_in(&dir, &["kickstart", "plain", "-f", "objects.yaml"]);
    assert_eq!(
        text(&out.stderr),
        "Error: kickstarting package: package folder already exists: plain\n"
    );
    let out = run_in(&dir, &["kickstart", "other", "-f", "nothing-*.yaml"]);
    assert_eq!(
        text(&out.stderr),
        "Error: kickstarting package: get input: expand pattern: nothing-*.yaml: file does not exist\n"
    );
    assert!(!dir.join("other").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ctrl-C ends a command with an error line and exit 1, as upstream's cancelled context does.
#[cfg(target_os = "linux")]
#[test]
fn an_interrupted_command_exits_one() {
    let dir = scratch("interrupt");
    // Reading objects from a stdin nobody writes to: the command waits until interrupted.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-package"))
        .args(["kickstart", "waiting", "-f", "-"])
        .current_dir(&dir)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Held open until the end: EOF would let the command finish on its own.
    let stdin = child.stdin.take();
    let pid = child.id().to_string();
    // The handler is in place once the process catches SIGINT (bit 2 of SigCgt).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << 1) != 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no SIGINT handler: {status}"
        );
        std::thread::yield_now();
    }
    let killed = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "Error: context canceled\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each command's `--help` opens with its own summary and usage, and no other command's summary: the
/// doc comments of neighbouring commands must not run together.
#[test]
fn every_command_help_says_what_that_command_does() {
    let commands: &[(&[&str], &str)] = &[
        (
            &["build"],
            "Build a package image from a folder; validates it first",
        ),
        (
            &["validate"],
            "Validate a package folder or, with --pull, a package image",
        ),
        (
            &["tree"],
            "Print the phases and objects a package renders to",
        ),
        (
            &["update"],
            "Resolve the digests of the manifest's images into manifest.lock.yaml",
        ),
        (
            &["kickstart"],
            "Create a package folder from existing Kubernetes objects (experimental)",
        ),
        (&["version"], "Print version information"),
        (
            &["rollout"],
            "Inspect and follow the rollouts of HostedClusterPackages, (Cluster)Packages and (Cluster)ObjectDeployments",
        ),
        (
            &["rollout", "status"],
            "Show where a HostedClusterPackage, (Cluster)Package or (Cluster)ObjectDeployment rollout stands and follow it until it finishes (exit 0), fails, or times out",
        ),
        (
            &["rollout", "plan"],
            "Show the next steps of a HostedClusterPackage rollout: groups in order, the next wave, and why the other Packages wait (the manager's own planner)",
        ),
        (
            &["rollout", "history"],
            "List the revisions (ObjectSets) of a (Cluster)Package or (Cluster)ObjectDeployment",
        ),
        (
            &["clustertree"],
            "Print the phases and objects of an installed (Cluster)Package",
        ),
        (
            &["repository"],
            "Manage a package repository index and its image",
        ),
        (&["repository", "init"], "Start an empty index: FILE NAME"),
        (
            &["repository", "add"],
            "Add a package image's versions: FILE PKGREF VERSION...",
        ),
        (
            &["repository", "remove"],
            "Remove a package image: FILE PKGREF",
        ),
        (
            &["repository", "pull"],
            "Write the index held by an image to FILE: FILE TAG",
        ),
        (
            &["repository", "push"],
            "Push FILE as an index image: FILE TAG",
        ),
        (
            &["completion"],
            "Print a shell completion script: bash, zsh, fish or powershell",
        ),
        (
            &["pause"],
            "Pause a (Cluster)Package: pko stops reconciling its objects",
        ),
        (&["unpause"], "Unpause a (Cluster)Package"),
    ];
    for (path, summary) in commands {
        let mut args = path.to_vec();
        args.push("--help");
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = text(&out.stdout);
        assert_eq!(help.lines().next(), Some(*summary), "{args:?}:\n{help}");
        assert!(
            help.contains(&format!("Usage: kubectl-package {}", path.join(" "))),
            "{args:?}:\n{help}"
        );
        for (other, other_summary) in commands.iter().filter(|(p, _)| p != path) {
            // A parent lists its subcommands' summaries; nothing else may appear.
            let listed = other.len() == path.len() + 1 && other.starts_with(path);
            assert!(
                listed || !help.contains(other_summary),
                "{args:?} shows the summary of {other:?}:\n{help}"
            );
        }
    }
}

/// `tests/simulate/`: a saved fleet (seven HostedClusters in three risk groups, all live on v1, the
/// HostedClusterPackage rolling out v2 with a 5 min soak, maxFailures 0, automatic rollback, and an
/// approval for the late group) and the simulator's expected output, byte for byte.
fn simulate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/simulate")
}

fn simulate(extra: &[&str]) -> (String, String, Option<i32>) {
    let mut args = vec![
        "rollout",
        "simulate",
        "hostedclusterpackage/addon",
        "--snapshot",
        "fleet.json",
        "--readiness",
        "2m",
    ];
    args.extend_from_slice(extra);
    let out = run_in(&simulate_dir(), &args);
    (text(&out.stdout), text(&out.stderr), out.status.code())
}

fn expected(file: &str) -> String {
    std::fs::read_to_string(simulate_dir().join(file)).unwrap()
}

#[test]
fn a_healthy_release_goes_group_by_group_through_soaks_and_the_approval() {
    let (stdout, stderr, code) = simulate(&[]);
    assert_eq!((stderr.as_str(), code), ("", Some(0)));
    assert_eq!(stdout, expected("release.txt"));
}

#[test]
fn a_failing_cluster_halts_its_group_and_the_fleet_rolls_back() {
    let (stdout, _, code) = simulate(&["--fail", "clusters=normal-1"]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, expected("failure.txt"));
}

#[test]
fn a_policy_override_is_simulated_without_editing_the_object() {
    let (stdout, _, code) = simulate(&[
        "--policy",
        "maxUnavailable=1",
        "--policy",
        "minSuccessTime=0s",
        "--no-approve",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, expected("policy.txt"));
}

#[test]
fn the_json_output_carries_the_same_story_and_bad_input_is_named() {
    let (stdout, _, code) = simulate(&["-o", "json", "--fail-rate", "0.3", "--seed", "3"]);
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["ending"]["kind"], "RolledBack");
    assert_eq!(json["maxUnavailable"], 2);
    let (again, _, _) = simulate(&["-o", "json", "--fail-rate", "0.3", "--seed", "3"]);
    assert_eq!(stdout, again, "the same seed tells the same story");
    for (args, says) in [
        (
            &["--fail", "clusters=nowhere"][..],
            "nowhere is no HostedCluster this rollout selects",
        ),
        (
            &["--fail-rate", "2"][..],
            "--fail-rate 2 is not between 0 and 1",
        ),
        (
            &["--policy", "speed=fast"][..],
            "--policy speed: want maxUnavailable",
        ),
    ] {
        let (_, stderr, code) = simulate(args);
        assert_eq!(code, Some(1), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
