//! Multi-component packages: a root manifest with `spec.components` (even `{}`) turns every
//! `components/<name>/` directory into a package of its own. A (Cluster)Package picks one with
//! `spec.component`; without it the root package is installed, without the `components/` tree.
//!
//! Pure: file maps in, file maps out. Loading the chosen files is the loader's job.

use std::collections::BTreeSet;

use super::files::PackageFiles;
use super::loader::{load_manifest, PackageError};

const COMPONENTS_DIR: &str = "components/";

/// The names of the package's components (`components/<name>/...`), sorted.
pub fn component_names(files: &PackageFiles) -> Vec<String> {
    files
        .keys()
        .filter_map(|path| path.strip_prefix(COMPONENTS_DIR)?.split_once('/'))
        .map(|(name, _)| name.to_owned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The files of the package to install: the root package, or component `component` of a
/// multi-component package (its paths relative to the component's directory).
pub fn select_component(
    files: &PackageFiles,
    component: Option<&str>,
) -> Result<PackageFiles, PackageError> {
    let (manifest_file, manifest) = load_manifest(files)?;
    let component = component.filter(|c| !c.is_empty());
    if manifest.spec.components.is_none() {
        return match component {
            None => Ok(files.clone()),
            Some(name) => Err(PackageError::NotMultiComponent {
                file: manifest_file,
                component: name.to_owned(),
            }),
        };
    }
    let Some(name) = component else {
        return Ok(files
            .iter()
            .filter(|(path, _)| !path.starts_with(COMPONENTS_DIR))
            .map(|(p, b)| (p.clone(), b.clone()))
            .collect());
    };
    let prefix = format!("{COMPONENTS_DIR}{name}/");
    let selected: PackageFiles = files
        .iter()
        .filter_map(|(path, bytes)| Some((path.strip_prefix(&prefix)?.to_owned(), bytes.clone())))
        .collect();
    if name.contains('/') || selected.is_empty() {
        return Err(PackageError::UnknownComponent {
            component: name.to_owned(),
            available: component_names(files).join(", "),
        });
    }
    Ok(selected)
}

/// Puts the component's name on an error from loading its files.
pub fn in_component(component: Option<&str>, error: PackageError) -> PackageError {
    match component.filter(|c| !c.is_empty()) {
        Some(name) => PackageError::InComponent {
            component: name.to_owned(),
            source: Box::new(error),
        },
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> PackageFiles {
        entries
            .iter()
            .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
            .collect()
    }

    const ROOT: &str = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: root}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: main}]\n  components: {}\n";
    const SINGLE: &str = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: single}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: main}]\n";

    #[test]
    fn picks_a_component_or_the_root_without_components() {
        let all = files(&[
            ("manifest.yaml", ROOT),
            ("root.yaml", "x"),
            ("components/api/manifest.yaml", "a"),
            ("components/api/deploy.yaml", "b"),
            ("components/web/manifest.yaml", "c"),
        ]);
        assert_eq!(component_names(&all), vec!["api", "web"]);
        let api = select_component(&all, Some("api")).unwrap();
        assert_eq!(
            api.keys().collect::<Vec<_>>(),
            vec!["deploy.yaml", "manifest.yaml"]
        );
        let root = select_component(&all, None).unwrap();
        assert_eq!(
            root.keys().collect::<Vec<_>>(),
            vec!["manifest.yaml", "root.yaml"]
        );
        assert_eq!(select_component(&all, Some("")).unwrap(), root);
    }

    #[test]
    fn unknown_components_and_single_component_packages_are_errors() {
        let all = files(&[
            ("manifest.yaml", ROOT),
            ("components/api/manifest.yaml", "a"),
        ]);
        assert_eq!(
            select_component(&all, Some("db")).unwrap_err().to_string(),
            "component \"db\" not found in components/ (available: api)"
        );
        assert!(select_component(&all, Some("api/../x")).is_err());
        let single = files(&[
            ("manifest.yaml", SINGLE),
            ("components/api/manifest.yaml", "a"),
        ]);
        assert_eq!(
            select_component(&single, Some("api")).unwrap_err().to_string(),
            "manifest.yaml: spec.component is \"api\", but the package is not multi-component (no spec.components)"
        );
        assert_eq!(select_component(&single, None).unwrap(), single);
    }
}
