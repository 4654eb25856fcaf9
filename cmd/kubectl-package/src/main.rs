//! `kubectl-package`: works with Package Operator packages. `validate` loads a package directory or a pulled
//! image (manifest, lock file, templates, every object's phase and labels) and reports the first problem
//! with file and line; `tree` prints the phases and objects the package produces; `build --push` validates
//! a directory and pushes it as a package image; `update` locks the digests of the manifest's images;
//! `pause`, `unpause` and `rollout history` act on installed packages and deployments.
//!
//! Exit codes: 0 valid, 1 the package is invalid, 2 the command could not run (usage, unreadable files).

mod cluster;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oci_client::secrets::RegistryAuth;
use pko_actors::package::components::{component_names, select_component};
use pko_actors::package::files::{from_dir, PackageFiles};
use pko_actors::package::image::ImageStore;
use pko_actors::package::image_lock::lock_for;
use pko_actors::package::loader::{load_installable, load_manifest, LoadedPackage, PackageError};
use pko_actors::package::oci_layout::{read_layout, write_layout};
use pko_actors::package::test_fixtures::{fixture_diff, load_case, render_case, FIXTURE_DIR};
use serde_json::{json, Value};

#[derive(Debug, Parser)]
#[command(version, about = "Work with Package Operator packages")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check that a package loads: manifest, templates, objects.
    Validate(Source),
    /// Print the phases and objects a package produces.
    Tree(Source),
    /// Validate a package directory and push it as a package image.
    /// Resolve the digests of the manifest's spec.images and write them to manifest.lock.yaml (the root
    /// package and each component).
    Update {
        /// Package directory.
        path: PathBuf,
        /// Registries spoken to over plain HTTP (local test registries), comma-separated hosts.
        #[arg(long, value_delimiter = ',')]
        plain_http: Vec<String>,
    },
    /// Pause a (Cluster)Package or (Cluster)ObjectDeployment: pko stops changing its objects.
    Pause(cluster::Target),
    /// Unpause it: pko reconciles its objects again.
    Unpause(cluster::Target),
    /// Rollouts of a (Cluster)Package or (Cluster)ObjectDeployment.
    #[command(subcommand)]
    Rollout(Rollout),
    #[command(group(clap::ArgGroup::new("target").required(true).multiple(true).args(["push", "output"])))]
    Build {
        #[command(flatten)]
        source: Source,
        /// Image reference to push to (registry/repository:tag).
        #[arg(long)]
        push: Option<String>,
        /// Write the image as an OCI layout tar to this file.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Tag recorded in the OCI layout (with --output only).
        #[arg(long, default_value = "latest")]
        tag: String,
    },
}

#[derive(Debug, Subcommand)]
enum Rollout {
    /// The revisions (ObjectSets): number, name, lifecycle state and availability, oldest first.
    History(cluster::Target),
}

#[derive(Debug, clap::Args)]
struct Source {
    /// Package directory (holding manifest.yaml) or OCI layout tar (`build --output`); omit with --pull.
    #[arg(required_unless_present = "pull")]
    path: Option<PathBuf>,
    /// Load the package from this image instead of a directory.
    #[arg(long, conflicts_with = "path")]
    pull: Option<String>,
    /// Package config (YAML or JSON) given to templates as `.config`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Component of a multi-component package (`components/<name>/`); without it `validate` and `build`
    /// check the root package and every component, `tree` shows the root package.
    #[arg(long)]
    component: Option<String>,
    /// Render with this test case of the manifest's test.template (its context and config) instead of
    /// --config and --namespace.
    #[arg(long, conflicts_with_all = ["config", "namespace"])]
    test_case: Option<String>,
    /// Namespace the package is rendered for; "" renders it as a ClusterPackage. Default: "" when the
    /// manifest declares the Cluster scope, else `default`.
    #[arg(long)]
    namespace: Option<String>,
    /// Registries spoken to over plain HTTP (local test registries), comma-separated hosts.
    #[arg(long, value_delimiter = ',')]
    plain_http: Vec<String>,
}

enum Failure {
    Invalid(String),
    CannotRun(String),
}

/// The config file's content, if one was given.
fn read_config(source: &Source) -> Result<Option<Value>, Failure> {
    let Some(path) = &source.config else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::CannotRun(format!("{}: {e}", path.display())))?;
    serde_saphyr::from_str(&text)
        .map(Some)
        .map_err(|e| Failure::CannotRun(format!("{}: {e}", path.display())))
}

/// The template context: the package is named like its manifest, in `namespace` ("" for cluster scope).
fn context(name: &str, namespace: &str, config: Value) -> Value {
    json!({
        "package": {"metadata": {"name": name, "namespace": namespace, "labels": {}, "annotations": {}}, "image": ""},
        "config": config,
        "environment": {"kubernetes": {"version": "v1.20.2"}},
    })
}

/// Registry credentials from PKO_REGISTRY_USERNAME / PKO_REGISTRY_PASSWORD, anonymous without them.
fn auth() -> RegistryAuth {
    match (
        std::env::var("PKO_REGISTRY_USERNAME"),
        std::env::var("PKO_REGISTRY_PASSWORD"),
    ) {
        (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
        _ => RegistryAuth::Anonymous,
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::CannotRun(format!("async runtime: {e}")))
}

fn files(source: &Source) -> Result<PackageFiles, Failure> {
    match (&source.path, &source.pull) {
        (Some(path), _) if path.is_file() => {
            let bytes = std::fs::read(path)
                .map_err(|e| Failure::CannotRun(format!("{}: {e}", path.display())))?;
            read_layout(&path.display().to_string(), &bytes)
                .map_err(|e| Failure::CannotRun(e.to_string()))
        }
        (Some(path), _) => from_dir(Path::new(path))
            .map_err(|e| Failure::CannotRun(format!("{}: {e}", path.display()))),
        (None, Some(image)) => {
            let store = ImageStore::new(source.plain_http.clone());
            let (digest, files) = runtime()?
                .block_on(store.fetch(image, &auth()))
                .map_err(|e| Failure::CannotRun(e.to_string()))?;
            eprintln!("pulled {image} ({digest})");
            Ok((*files).clone())
        }
        (None, None) => Err(Failure::CannotRun(
            "give a package directory or --pull IMAGE".to_owned(),
        )),
    }
}

/// Loads the root package (or `component`) as a Package with the source's config would install it.
fn load_one(
    source: &Source,
    files: &PackageFiles,
    component: Option<&str>,
) -> Result<LoadedPackage, Failure> {
    if let Some(name) = &source.test_case {
        let invalid = |e: PackageError| Failure::Invalid(e.to_string());
        let selected = select_component(files, component).map_err(invalid)?;
        let (_, manifest) = load_manifest(&selected).map_err(invalid)?;
        let cases = manifest.test.map(|t| t.template).unwrap_or_default();
        let case = cases.iter().find(|c| &c.name == name).ok_or_else(|| {
            let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
            Failure::Invalid(format!(
                "test case {name:?} not found in test.template (cases: {})",
                names.join(", ")
            ))
        })?;
        return load_case(files, component, case).map_err(invalid);
    }
    let config = read_config(source)?;
    load_installable(files, component, config.as_ref(), |manifest, config| {
        let name = manifest.metadata.name.clone().unwrap_or_default();
        let namespace = source.namespace.clone().unwrap_or_else(|| {
            let cluster = manifest.spec.scopes.iter().any(|s| s.as_str() == "Cluster");
            if cluster { "" } else { "default" }.to_owned()
        });
        context(&name, &namespace, config)
    })
    .map_err(|e| Failure::Invalid(e.to_string()))
}

/// A loaded package and the component it is (None: the root package).
type Loaded = (Option<String>, LoadedPackage);

/// The package `--component` names (or the root), plus, with `every_component`, each component of a
/// multi-component package: (component, package) in that order.
fn load(source: &Source, every_component: bool) -> Result<(PackageFiles, Vec<Loaded>), Failure> {
    let files = files(source)?;
    let chosen = source.component.as_deref();
    let mut loaded = vec![(chosen.map(str::to_owned), load_one(source, &files, chosen)?)];
    if every_component && chosen.is_none() && loaded[0].1.manifest.spec.components.is_some() {
        for name in component_names(&files) {
            let package = load_one(source, &files, Some(&name))?;
            loaded.push((Some(name), package));
        }
    }
    if let (true, Some(dir)) = (every_component, &source.path) {
        for (component, package) in &loaded {
            check_fixtures(dir, &files, component.as_deref(), package)?;
        }
    }
    Ok((files, loaded))
}

/// Renders the package's template test cases and compares each with its fixture under
/// `.test-fixtures/` (written when missing).
fn check_fixtures(
    dir: &Path,
    files: &PackageFiles,
    component: Option<&str>,
    package: &LoadedPackage,
) -> Result<(), Failure> {
    let cases = package
        .manifest
        .test
        .as_ref()
        .map(|t| t.template.as_slice())
        .unwrap_or_default();
    let package_dir = match component {
        Some(name) => dir.join("components").join(name),
        None => dir.to_owned(),
    };
    for case in cases {
        let actual = render_case(files, component, case)
            .map_err(|e| Failure::Invalid(format!("test case {:?}: {e}", case.name)))?;
        let relative = format!("{FIXTURE_DIR}/{}.yaml", case.name);
        let path = package_dir.join(&relative);
        let cannot = |e: std::io::Error| Failure::CannotRun(format!("{}: {e}", path.display()));
        match std::fs::read_to_string(&path) {
            Ok(expected) => {
                if let Some(diff) = fixture_diff(&expected, &actual) {
                    return Err(Failure::Invalid(format!(
                        "test case {:?}: output differs from {relative} (delete it to accept the new output):\n{diff}",
                        case.name
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(cannot)?;
                }
                std::fs::write(&path, actual).map_err(cannot)?;
                eprintln!("wrote fixture {}", path.display());
            }
            Err(e) => return Err(cannot(e)),
        }
    }
    Ok(())
}

fn summary(component: Option<&str>, package: &LoadedPackage) -> String {
    let objects: usize = package.phases.iter().map(|p| p.objects.len()).sum();
    let what = component.map_or_else(|| "Package".to_owned(), |c| format!("Component {c}"));
    format!(
        "{what} validated: {} phases, {objects} objects.",
        package.phases.len()
    )
}

fn build(
    source: &Source,
    push: Option<&str>,
    output: Option<&Path>,
    tag: &str,
) -> Result<String, Failure> {
    let (files, packages) = load(source, true)?;
    for (component, package) in &packages {
        eprintln!("{}", summary(component.as_deref(), package));
    }
    let mut done = Vec::new();
    if let Some(output) = output {
        let tar = write_layout(&files, tag).map_err(|e| Failure::CannotRun(e.to_string()))?;
        std::fs::write(output, &tar)
            .map_err(|e| Failure::CannotRun(format!("{}: {e}", output.display())))?;
        done.push(format!(
            "Wrote {} ({} files, {} bytes)",
            output.display(),
            files.len(),
            tar.len()
        ));
    }
    if let Some(image) = push {
        eprintln!("pushing {} files to {image}", files.len());
        let store = ImageStore::new(source.plain_http.clone());
        let url = runtime()?
            .block_on(store.push(image, &files, &auth()))
            .map_err(|e| Failure::CannotRun(e.to_string()))?;
        done.push(format!("Pushed {image} ({url})"));
    }
    Ok(done.join("\n"))
}

/// Locks the images of the package (or component) in `dir`; returns what it did.
fn update_dir(
    dir: &Path,
    store: &ImageStore,
    runtime: &tokio::runtime::Runtime,
) -> Result<String, Failure> {
    let files = from_dir(dir).map_err(|e| Failure::CannotRun(format!("{}: {e}", dir.display())))?;
    let (_, manifest) = load_manifest(&files).map_err(|e| Failure::Invalid(e.to_string()))?;
    let lock_name = if files.contains_key("manifest.lock.yml") {
        "manifest.lock.yml"
    } else {
        "manifest.lock.yaml"
    };
    let lock_path = dir.join(lock_name);
    if manifest.spec.images.is_empty() {
        return Ok(format!(
            "{}: no spec.images, nothing to lock",
            dir.display()
        ));
    }
    let mut digests = BTreeMap::new();
    for image in &manifest.spec.images {
        let digest = runtime
            .block_on(store.resolve_digest(&image.image, &auth()))
            .map_err(|e| Failure::CannotRun(e.to_string()))?;
        eprintln!("{} {} -> {digest}", image.name, image.image);
        digests.insert(image.name.clone(), digest);
    }
    let yaml = serde_saphyr::to_string(&lock_for(&manifest, &digests))
        .map_err(|e| Failure::CannotRun(format!("{}: {e}", lock_path.display())))?;
    let unchanged = std::fs::read_to_string(&lock_path).is_ok_and(|old| old == yaml);
    if unchanged {
        return Ok(format!("{} is up to date", lock_path.display()));
    }
    std::fs::write(&lock_path, yaml)
        .map_err(|e| Failure::CannotRun(format!("{}: {e}", lock_path.display())))?;
    Ok(format!(
        "Updated {} ({} images)",
        lock_path.display(),
        digests.len()
    ))
}

fn update(dir: &Path, plain_http: &[String]) -> Result<String, Failure> {
    let files = from_dir(dir).map_err(|e| Failure::CannotRun(format!("{}: {e}", dir.display())))?;
    let store = ImageStore::new(plain_http.to_vec());
    let runtime = runtime()?;
    let mut out = vec![update_dir(dir, &store, &runtime)?];
    for component in component_names(&files) {
        out.push(update_dir(
            &dir.join("components").join(component),
            &store,
            &runtime,
        )?);
    }
    Ok(out.join("\n"))
}

fn on_cluster(
    command: impl std::future::Future<Output = Result<String, cluster::ClusterError>>,
) -> Result<String, Failure> {
    runtime()?
        .block_on(command)
        .map_err(|e| Failure::CannotRun(e.to_string()))
}

fn tree(package: &LoadedPackage) -> String {
    let mut out = format!(
        "Package {}\n",
        package
            .manifest
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
    );
    for (i, phase) in package.phases.iter().enumerate() {
        let last_phase = i + 1 == package.phases.len();
        let class = if phase.class.is_empty() {
            String::new()
        } else {
            format!(" (class {})", phase.class)
        };
        out.push_str(&format!(
            "{} Phase {}{class}\n",
            if last_phase { "└──" } else { "├──" },
            phase.name
        ));
        for (j, object) in phase.objects.iter().enumerate() {
            let o = &object.object;
            let field = |p: &str| {
                o.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let namespace = field("/metadata/namespace");
            let name = if namespace.is_empty() {
                field("/metadata/name")
            } else {
                format!("{namespace}/{}", field("/metadata/name"))
            };
            let branch = if j + 1 == phase.objects.len() {
                "└──"
            } else {
                "├──"
            };
            let indent = if last_phase { "    " } else { "│   " };
            out.push_str(&format!(
                "{indent}{branch} {} {} {name}\n",
                field("/apiVersion"),
                field("/kind")
            ));
        }
    }
    out
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.command {
        Command::Validate(source) => load(source, true).map(|(_, packages)| {
            packages
                .iter()
                .map(|(component, package)| summary(component.as_deref(), package))
                .collect::<Vec<_>>()
                .join("\n")
        }),
        Command::Tree(source) => load(source, false).map(|(_, packages)| tree(&packages[0].1)),
        Command::Build {
            source,
            push,
            output,
            tag,
        } => build(source, push.as_deref(), output.as_deref(), tag),
        Command::Update { path, plain_http } => update(path, plain_http),
        Command::Pause(target) => on_cluster(cluster::set_paused(target, true)),
        Command::Unpause(target) => on_cluster(cluster::set_paused(target, false)),
        Command::Rollout(Rollout::History(target)) => on_cluster(cluster::history(target)),
    };
    match result {
        Ok(out) => {
            println!("{}", out.trim_end());
            ExitCode::SUCCESS
        }
        Err(Failure::Invalid(message)) => {
            eprintln!("kubectl-package: invalid package: {message}");
            ExitCode::from(1)
        }
        Err(Failure::CannotRun(message)) => {
            eprintln!("kubectl-package: {message}");
            ExitCode::from(2)
        }
    }
}
