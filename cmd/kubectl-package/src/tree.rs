//! `tree`: renders the root package once, as upstream does (metadata and config from a test case, a
//! config file or defaults; an empty environment; every image the static image) and prints its phases
//! and objects in upstream's exact tree format.

use std::path::Path;

use pko_package::config::{admit_config, PACKAGE_CONFIG_PATH};
use pko_package::files::PackageFiles;
use pko_package::loader::{load_package_with, Images, LoadedPackage, Render};
use pko_package::manifest::{config_schema, parse_manifest, PackageError};
use pko_package::object_checks::object_gvk;
use pko_package::violation::{reason, Violation};
use pko_package::yaml::split_documents;
use pko_proto::manifests::PackageManifestScope;
use serde_json::{json, Map, Value};

use crate::args::TreeArgs;
use crate::validation::{cases, import, manifest_and_lock_findings};

/// The tree of the package in `dir`, or the error message (with its `rendering package: ` prefix where
/// upstream has one).
pub fn tree(dir: &Path, args: &TreeArgs) -> Result<String, String> {
    let prefix = |e: String| format!("rendering package: {e}");
    let files = import(dir).map_err(prefix)?;
    let (_, manifest) = parse_manifest(&files).map_err(|e| prefix(e.to_string()))?;
    // Components are never rendered by tree: only the root's files count.
    let files: PackageFiles = if manifest.spec.components.is_some() {
        files
            .into_iter()
            .filter(|(p, _)| !p.starts_with("components/"))
            .collect()
    } else {
        files
    };

    let cases = cases(&manifest);
    let named = args
        .config_testcase
        .as_ref()
        .and_then(|name| cases.iter().find(|c| &c.name == name));
    // An unknown test case name falls back to the defaults, as upstream does.
    let metadata_case = if args.config_testcase.is_some() {
        named
    } else {
        cases.first()
    };
    let config = match &args.config_path {
        Some(path) => Some(read_config(path)?),
        None => metadata_case.and_then(|c| c.context.config.clone()),
    };
    let (name, mut namespace, labels, annotations, image) = match metadata_case {
        Some(case) => {
            let p = &case.context.package;
            (
                p.metadata.name.clone(),
                p.metadata.namespace.clone(),
                p.metadata.labels.clone(),
                p.metadata.annotations.clone(),
                p.image.clone(),
            )
        }
        None => (
            "name".to_owned(),
            "namespace".to_owned(),
            Default::default(),
            Default::default(),
            String::new(),
        ),
    };
    let cluster = args.cluster || namespace.is_empty();
    if cluster {
        namespace.clear();
    }

    let config = admit_config(
        config_schema(&manifest).as_ref(),
        config.as_ref(),
        PACKAGE_CONFIG_PATH,
    )
    .map_err(|errors| prefix(PackageError::Fields(errors).to_string()))?;

    let parse_failure = |e: String| prefix(format!("parsing package contents: {e}"));
    let (mut problems, _) = manifest_and_lock_findings(&files, &manifest, true);
    let scope = if cluster {
        PackageManifestScope::Cluster
    } else {
        PackageManifestScope::Namespaced
    };
    if !manifest.spec.scopes.contains(&scope) {
        problems.push(
            Violation::new(reason::UNSUPPORTED_SCOPE)
                .in_file("manifest.yaml")
                .to_string(),
        );
    }
    if !problems.is_empty() {
        return Err(parse_failure(problems.join("\n")));
    }

    let context = json!({
        "package": {
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
            "image": image,
        },
        "config": config,
        "environment": {"kubernetes": {"version": ""}},
    });
    let loaded = load_package_with(&files, &context, Render::Templates, Images::Static)
        .map_err(|e| parse_failure(e.to_string()))?;
    let kind = if cluster { "ClusterPackage" } else { "Package" };
    Ok(format_tree(&loaded, kind, &namespace, &name))
}

/// `--config-path`: YAML or JSON, first document, a mapping.
fn read_config(path: &str) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_owned(),
            _ => e.to_string(),
        };
        format!("getting config: read config from file: open {path}: {why}")
    })?;
    let document = split_documents(&text)
        .first()
        .map_or("", |(_, document)| *document);
    let value: Value = serde_saphyr::from_str(document)
        .map_err(|e| format!("getting config: unmarshal config from file {path}: {e}"))?;
    match value {
        Value::Object(_) => Ok(value),
        Value::Null => Ok(Value::Object(Map::new())),
        other => Err(format!(
            "getting config: unmarshal config from file {path}: json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
            match other {
                Value::Array(_) => "array",
                Value::String(_) => "string",
                Value::Number(_) => "number",
                _ => "bool",
            }
        )),
    }
}

/// Upstream's tree text: the manifest name, the package, then its phases with objects.
pub fn format_tree(loaded: &LoadedPackage, kind: &str, namespace: &str, name: &str) -> String {
    let header = format!(
        "{}\n{kind} {namespace}/{name}\n",
        loaded.manifest.metadata.name.as_deref().unwrap_or_default()
    );
    let phases: Vec<(&str, Vec<&Value>)> = loaded
        .phases
        .iter()
        .filter(|p| !p.objects.is_empty())
        .map(|p| {
            (
                p.name.as_str(),
                p.objects.iter().map(|o| &o.object).collect(),
            )
        })
        .collect();
    header + &phase_lines(&phases)
}

/// The phase and object lines of a tree, with gotree's connectors: every phase line starts `└── `, the
/// objects of the last phase `    └── `, all others `│   ├── `.
pub fn phase_lines(phases: &[(&str, Vec<&Value>)]) -> String {
    let mut out = String::new();
    for (i, (phase, objects)) in phases.iter().enumerate() {
        out.push_str(&format!("└── Phase {phase}\n"));
        let connector = if i + 1 == phases.len() {
            "    └── "
        } else {
            "│   ├── "
        };
        for object in objects {
            out.push_str(connector);
            out.push_str(&object_line(object));
            out.push('\n');
        }
    }
    out
}

/// `<group>/<version>, Kind=<Kind> <namespace>/<name>`, as Go prints a GroupVersionKind and an object key.
pub fn object_line(object: &Value) -> String {
    let (group, version, kind) = object_gvk(object);
    let field = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    format!(
        "{group}/{version}, Kind={kind} {}/{}",
        field("/metadata/namespace"),
        field("/metadata/name")
    )
}
