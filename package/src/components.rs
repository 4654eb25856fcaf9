//! Multi-component packages: a root manifest with `spec.components` (even `{}`) turns every
//! `components/<name>/` directory into a package of its own. A (Cluster)Package picks one with
//! `spec.component`; without it the root package is installed, without the `components/` tree.
//!
//! Pure: file maps in, file maps out. Loading the chosen files is the loader's job.

use std::collections::BTreeSet;

use super::files::PackageFiles;
use pko_proto::manifests::PackageManifest;

use super::manifest::{load_manifest, parse_manifest, PackageError};
use super::violation::{reason, Violation};

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
    let (_, manifest) = load_manifest(files)?;
    let component = component.filter(|c| !c.is_empty());
    if manifest.spec.components.is_none() {
        return match component {
            None => Ok(files.clone()),
            Some(name) => Err(Violation::new(reason::COMPONENTS_NOT_ENABLED)
                .details(format!(
                    "{name:?} requested, but the root manifest has no spec.components"
                ))
                .into()),
        };
    }
    check_components_dir(files)?;
    let Some(name) = component else {
        return Ok(root_files(files));
    };
    let selected = component_files(files, name);
    if name.contains('/') || selected.is_empty() {
        return Err(Violation::new(reason::COMPONENT_NOT_FOUND)
            .details(format!(
                "{name:?} (components: {})",
                component_names(files).join(", ")
            ))
            .into());
    }
    let (_, component_manifest) =
        load_manifest(&selected).map_err(|e| in_component(Some(name), e))?;
    if component_manifest.spec.components.is_some() {
        return Err(Violation::new(reason::NESTED_MULTI_COMPONENT)
            .component(name)
            .into());
    }
    Ok(selected)
}

/// The root package's own files: everything but `components/`.
fn root_files(files: &PackageFiles) -> PackageFiles {
    files
        .iter()
        .filter(|(path, _)| !path.starts_with(COMPONENTS_DIR))
        .map(|(p, b)| (p.clone(), b.clone()))
        .collect()
}

/// The files of component `name`, relative to its directory.
fn component_files(files: &PackageFiles, name: &str) -> PackageFiles {
    let prefix = format!("{COMPONENTS_DIR}{name}/");
    files
        .iter()
        .filter_map(|(path, bytes)| Some((path.strip_prefix(&prefix)?.to_owned(), bytes.clone())))
        .collect()
}

/// One package of a package's files: a component (by name) or the root (None), with its files and its
/// manifest as parsed (not yet validated).
pub type PackageUnit = (Option<String>, PackageFiles, PackageManifest);

/// Upstream's structural load: the root manifest and, when the root enables components, the
/// components directory and each component's manifest (no nesting). Components come first, in name
/// order, then the root without `components/`.
pub fn package_units(files: &PackageFiles) -> Result<Vec<PackageUnit>, PackageError> {
    let (_, root) = parse_manifest(files)?;
    if root.spec.components.is_none() {
        return Ok(vec![(None, files.clone(), root)]);
    }
    check_components_dir(files)?;
    let mut units = Vec::new();
    for name in component_names(files) {
        let unit_files = component_files(files, &name);
        let (_, manifest) = parse_manifest(&unit_files)?;
        if manifest.spec.components.is_some() {
            return Err(Violation::new(reason::NESTED_MULTI_COMPONENT)
                .component(name)
                .into());
        }
        units.push((Some(name), unit_files, manifest));
    }
    units.push((None, root_files(files), root));
    Ok(units)
}

/// A multi-component package's `components/` holds directories only (hidden files are never part of a
/// package).
fn check_components_dir(files: &PackageFiles) -> Result<(), PackageError> {
    match files
        .keys()
        .filter_map(|path| path.strip_prefix(COMPONENTS_DIR))
        .find(|rest| !rest.contains('/'))
    {
        Some(file) => Err(Violation::new(reason::FILE_IN_COMPONENTS_DIR)
            .in_file(format!("{COMPONENTS_DIR}{file}"))
            .into()),
        None => Ok(()),
    }
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
            ("components/api/manifest.yaml", SINGLE),
            ("components/api/deploy.yaml", "b"),
            ("components/web/manifest.yaml", SINGLE),
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
            ("components/api/manifest.yaml", SINGLE),
        ]);
        assert_eq!(
            select_component(&all, Some("db")).unwrap_err().to_string(),
            "Component not found: \"db\" (components: api)"
        );
        assert!(select_component(&all, Some("api/../x")).is_err());
        let single = files(&[
            ("manifest.yaml", SINGLE),
            ("components/api/manifest.yaml", SINGLE),
        ]);
        assert_eq!(
            select_component(&single, Some("api")).unwrap_err().to_string(),
            "Components not enabled: \"api\" requested, but the root manifest has no spec.components"
        );
        assert_eq!(select_component(&single, None).unwrap(), single);
    }
}
