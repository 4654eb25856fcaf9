//! Template test cases (`test.template` in the manifest): each case renders the package with its own
//! template context, and the result is kept as a fixture, `.test-fixtures/<case>.yaml` next to the
//! manifest (a dot-path, so never part of the package). The first run writes the fixture; later runs
//! compare and report the lines that changed, so a template change that alters output is caught.
//!
//! Pure: rendering to text and comparing; reading and writing fixture files is the CLI's.

use pko_proto::manifests::PackageManifestTestCaseTemplate;
use serde_json::Value;

use super::files::PackageFiles;
use super::loader::{load_installable, LoadedPackage, PackageError};

/// Directory of the fixtures, relative to the manifest.
pub const FIXTURE_DIR: &str = ".test-fixtures";

/// The fixture text of a loaded package: every object as YAML, grouped by phase in order.
pub fn fixture_text(package: &LoadedPackage) -> String {
    let mut out = String::new();
    for phase in &package.phases {
        out.push_str(&format!("# Phase {}\n", phase.name));
        for object in &phase.objects {
            out.push_str("---\n");
            let yaml = serde_saphyr::to_string(&object.object).unwrap_or_default();
            out.push_str(yaml.trim_end());
            out.push('\n');
        }
    }
    out
}

/// Loads the package as one test case gives it: the case's context, its config admitted like a
/// Package's.
pub fn load_case(
    files: &PackageFiles,
    component: Option<&str>,
    case: &PackageManifestTestCaseTemplate,
) -> Result<LoadedPackage, PackageError> {
    let mut context = serde_json::to_value(&case.context).unwrap_or(Value::Null);
    let config = case.context.config.clone();
    load_installable(files, component, config.as_ref(), |_, admitted| {
        if let Some(map) = context.as_object_mut() {
            map.insert("config".to_owned(), admitted);
        }
        context
    })
}

/// Renders one test case into its fixture text.
pub fn render_case(
    files: &PackageFiles,
    component: Option<&str>,
    case: &PackageManifestTestCaseTemplate,
) -> Result<String, PackageError> {
    load_case(files, component, case).map(|loaded| fixture_text(&loaded))
}

/// Where `actual` differs from the `expected` fixture (None: identical): up to 10 changed lines.
pub fn fixture_diff(expected: &str, actual: &str) -> Option<String> {
    if expected == actual {
        return None;
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut changes = Vec::new();
    for i in 0..old.len().max(new.len()) {
        let (a, b) = (old.get(i), new.get(i));
        if a != b {
            changes.push(format!(
                "line {}: -{} +{}",
                i + 1,
                a.map_or("(none)".to_owned(), |l| format!("{l:?}")),
                b.map_or("(none)".to_owned(), |l| format!("{l:?}"))
            ));
        }
        if changes.len() == 10 {
            changes.push("...".to_owned());
            break;
        }
    }
    Some(changes.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: t}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: main}]\n  config:\n    openAPIV3Schema:\n      type: object\n      properties:\n        size: {type: integer, default: 1}\n";
    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .package.metadata.name }}\n  namespace: {{ .package.metadata.namespace }}\n  annotations: {package-operator.run/phase: main}\ndata:\n  size: \"{{ .config.size }}\"\n";

    fn files() -> PackageFiles {
        [("manifest.yaml", MANIFEST), ("cm.yaml.gotmpl", CM)]
            .iter()
            .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn cases_render_with_their_context_and_admitted_config() {
        let case: PackageManifestTestCaseTemplate = serde_json::from_value(serde_json::json!({
            "name": "defaults",
            "context": {"package": {"metadata": {"name": "pkg", "namespace": "team"}}},
        }))
        .unwrap();
        let text = render_case(&files(), None, &case).unwrap();
        assert!(text.starts_with("# Phase main\n---\n"), "{text}");
        assert!(text.contains("name: pkg"), "{text}");
        assert!(text.contains("namespace: team"), "{text}");
        assert!(
            text.contains("size: '1'") || text.contains("size: \"1\""),
            "{text}"
        );
    }

    #[test]
    fn diffs_name_the_changed_lines() {
        assert_eq!(fixture_diff("a\nb\n", "a\nb\n"), None);
        assert_eq!(
            fixture_diff("a\nb\n", "a\nc\nd\n").unwrap(),
            "line 2: -\"b\" +\"c\"\nline 3: -(none) +\"d\""
        );
    }
}
