//! Template test cases (`test.template` in the manifest), as upstream's `kubectl package validate` and
//! `build` run them: each case renders the package with its own context, and the rendered object files
//! are kept as fixtures in `.test-fixtures/<case>/` next to the manifest (a dot-path, so never part of
//! the package). A missing case directory is generated; an existing one is compared file by file.
//!
//! Pure: what a case renders to and which files it owns. Reading, writing and diffing files is the CLI's.

use std::collections::BTreeMap;

use pko_proto::manifests::PackageManifestTestCaseTemplate;
use serde_json::Value;

use super::config::default_config;
use super::files::PackageFiles;
use super::loader::{load_package_with, Images, LoadedPackage, Render};
use super::manifest::{config_schema, load_manifest, PackageError};

/// Directory of the fixtures, relative to the manifest.
pub const FIXTURE_DIR: &str = ".test-fixtures";

/// A test case's name becomes a directory under [`FIXTURE_DIR`]: it must be one plain path component, so
/// fixtures are never written outside the package.
pub fn check_case_name(name: &str) -> Result<(), String> {
    let plain =
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(())
    } else {
        Err(format!(
            "test case name {name:?}: must be one path component (not empty, \".\" or \"..\", no / or \\)"
        ))
    }
}

/// Loads the package (the files of one unit: the root or a component) as one test case renders it: the
/// case's package metadata and environment, its config pruned and defaulted (admission errors are not
/// the test's concern), every image the static image.
pub fn load_case(
    files: &PackageFiles,
    case: &PackageManifestTestCaseTemplate,
) -> Result<LoadedPackage, PackageError> {
    let (_, manifest) = load_manifest(files)?;
    let schema = config_schema(&manifest);
    let mut context = serde_json::to_value(&case.context).unwrap_or(Value::Null);
    if let Some(map) = context.as_object_mut() {
        map.insert(
            "config".to_owned(),
            default_config(schema.as_ref(), case.context.config.as_ref()),
        );
    }
    load_package_with(files, &context, Render::Templates, Images::Static)
}

/// The fixture files of a rendered case: path → content. A file whose objects the condition annotation
/// partly removed keeps the rest (trimmed, joined by `---`); a file with none left gets no fixture.
pub fn fixture_files(package: &LoadedPackage) -> BTreeMap<String, String> {
    package
        .object_files
        .iter()
        .filter_map(|(path, file)| {
            let content = match &file.kept {
                None => file.text.clone(),
                Some(kept) if kept.is_empty() => return None,
                Some(kept) => format!("{}\n", kept.join("\n---\n")),
            };
            (!content.trim().is_empty()).then(|| (path.clone(), content))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_stay_inside_the_fixture_directory() {
        for good in ["namespaced", "ha-3", "with.dot"] {
            assert_eq!(check_case_name(good), Ok(()));
        }
        for bad in ["", ".", "..", "../escape", "a/b", "/abs", "a\\b", "nul\0"] {
            assert!(check_case_name(bad).is_err(), "{bad:?}");
        }
    }

    const MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: t}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: main}]\n  config:\n    openAPIV3Schema:\n      type: object\n      properties:\n        size: {type: integer, default: 1}\n        ha: {type: boolean, default: false}\n";
    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .package.metadata.name }}\n  namespace: {{ .package.metadata.namespace }}\n  annotations: {package-operator.run/phase: main}\ndata:\n  size: \"{{ .config.size }}\"\n";
    const FILTERED: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: always\n  annotations: {package-operator.run/phase: main}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ha-only\n  annotations: {package-operator.run/phase: main, package-operator.run/condition: .config.ha}\n";

    fn files() -> PackageFiles {
        [
            ("manifest.yaml", MANIFEST),
            ("cm.yaml.gotmpl", CM),
            ("filtered.yaml", FILTERED),
            ("notes.md", "not an object file"),
        ]
        .iter()
        .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
        .collect()
    }

    fn case(config: Value) -> PackageManifestTestCaseTemplate {
        serde_json::from_value(serde_json::json!({
            "name": "defaults",
            "context": {"package": {"metadata": {"name": "pkg", "namespace": "team"}}, "config": config},
        }))
        .unwrap()
    }

    #[test]
    fn cases_render_with_their_context_and_defaulted_config() {
        let fixtures = fixture_files(&load_case(&files(), &case(serde_json::json!({}))).unwrap());
        assert_eq!(
            fixtures.keys().collect::<Vec<_>>(),
            vec!["cm.yaml", "filtered.yaml"]
        );
        assert_eq!(
            fixtures["cm.yaml"],
            CM.replace("{{ .package.metadata.name }}", "pkg")
                .replace("{{ .package.metadata.namespace }}", "team")
                .replace("{{ .config.size }}", "1")
        );
        // Filtered: the rest, trimmed and joined; unfiltered files stay byte for byte.
        assert_eq!(
            fixtures["filtered.yaml"],
            format!("{}\n", FILTERED.split("---\n").next().unwrap().trim())
        );
        let ha =
            fixture_files(&load_case(&files(), &case(serde_json::json!({"ha": true}))).unwrap());
        assert_eq!(ha["filtered.yaml"], FILTERED);
    }
}
