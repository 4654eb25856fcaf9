//! `validate` and the validation `build` runs first, in upstream's order: import the folder, load its
//! structure (root and component manifests), then run every validator and report all their findings at
//! once: manifest and lock checks, lock consistency, the static-file check (root without test templates)
//! and the template tests with their fixtures.

use std::path::{Path, PathBuf};

use pko_package::components::package_units;
use pko_package::files::{from_dir, PackageFiles};
use pko_package::image_lock::resolve_images;
use pko_package::loader::{load_package_with, Images, Render};
use pko_package::manifest::{load_lock, manifest_errors, PackageError};
use pko_package::oci_layout::read_layout;
use pko_package::template_test_cases::load_case;
use pko_package::violation::{reason, Violation};
use pko_proto::manifests::PackageManifest;
use serde_json::json;

use crate::fixtures::{check_case, CaseCheck};

/// One package of a folder: the root or a component, with its own files and manifest.
pub struct Unit {
    pub component: Option<String>,
    pub dir: PathBuf,
    pub files: PackageFiles,
    pub manifest: PackageManifest,
}

impl Unit {
    /// Puts the component's name in front of a message about it.
    fn name(&self, message: String) -> String {
        match &self.component {
            Some(c) => format!("component {c:?}: {message}"),
            None => message,
        }
    }
}

/// Reads a package folder as upstream imports it (hidden entries and symlinks skipped), or a tarball
/// `build -o` wrote (pko's addition).
pub fn import(dir: &Path) -> Result<PackageFiles, String> {
    if dir.is_file() {
        let bytes = std::fs::read(dir).map_err(|e| format!("importing package from file: {e}"))?;
        return read_layout(&dir.display().to_string(), &bytes)
            .map_err(|e| format!("importing package from file: {e}"));
    }
    if !dir.is_dir() {
        let why = if dir.exists() {
            "not a directory".to_owned()
        } else {
            "stat .: no such file or directory".to_owned()
        };
        return Err(format!(
            "importing package from folder: walk source dir: access file .: {why}"
        ));
    }
    from_dir(dir).map_err(|e| format!("importing package from folder: walk source dir: {e}"))
}

/// The structural load (see `package_units`), each unit with its directory under `dir`.
pub fn structure(dir: &Path, files: &PackageFiles) -> Result<Vec<Unit>, PackageError> {
    Ok(package_units(files)?
        .into_iter()
        .map(|(component, files, manifest)| Unit {
            dir: component
                .as_ref()
                .map_or_else(|| dir.to_owned(), |c| dir.join("components").join(c)),
            component,
            files,
            manifest,
        })
        .collect())
}

/// Runs every validator over the units (root last), the template tests with their fixtures when
/// `run_tests`; returns all findings, or a hard failure (a fixture missing for a rendered file).
pub fn validate_units(units: &[Unit], run_tests: bool) -> Result<Vec<String>, String> {
    let mut findings = Vec::new();
    let mut testable = Vec::new();
    for unit in units {
        let (found, renderable) =
            manifest_and_lock_findings(&unit.files, &unit.manifest, unit.component.is_none());
        findings.extend(found.into_iter().map(|f| unit.name(f)));
        testable.push(renderable);
        // The static-file check (its own prefix, as upstream nests it): nothing is rendered, so the
        // context is empty. Upstream runs it for the root only; pko checks components too, since the
        // manager would refuse a broken one anyway.
        if renderable && cases(&unit.manifest).is_empty() {
            if let Err(e) =
                load_package_with(&unit.files, &json!({}), Render::StaticOnly, Images::Static)
            {
                findings.push(unit.name(format!("loading package from files: {e}")));
            }
        }
    }
    for (unit, ok) in units.iter().zip(testable) {
        // A unit whose manifest or lock is wrong is not tested: its case names are not safe paths yet,
        // and rendering would only repeat the lock's complaint.
        if !ok || !run_tests {
            continue;
        }
        for case in cases(&unit.manifest) {
            let loaded = match load_case(&unit.files, case) {
                Ok(loaded) => loaded,
                Err(e) => {
                    findings.push(unit.name(e.to_string()));
                    break;
                }
            };
            match check_case(&unit.dir, &case.name, &loaded)? {
                CaseCheck::Pass => {}
                CaseCheck::Mismatch(found) => {
                    findings.extend(found.into_iter().map(|f| unit.name(f)));
                    break;
                }
            }
        }
    }
    Ok(findings)
}

/// Upstream's manifest and lock validators for one unit: the manifest's content, the lock file, and, for
/// the root (`root`), lock consistency. Returns the findings and whether the unit can be rendered.
pub fn manifest_and_lock_findings(
    files: &PackageFiles,
    manifest: &PackageManifest,
    root: bool,
) -> (Vec<String>, bool) {
    let mut findings = Vec::new();
    let errors = manifest_errors(manifest);
    let manifest_ok = errors.is_empty();
    if !manifest_ok {
        findings.push(PackageError::Fields(errors).to_string());
    }
    let lock_ok = match load_lock(files) {
        Err(e) => {
            findings.push(e.to_string());
            false
        }
        // Lock consistency is the root's alone.
        Ok(_) if !root => true,
        Ok(lock) => match resolve_images(manifest, lock.as_ref().map(|(f, l)| (*f, l))) {
            Ok(_) => true,
            Err(e) => {
                findings.push(e.to_string());
                false
            }
        },
    };
    (findings, manifest_ok && lock_ok)
}

/// The manifest's test cases (`test.template`).
pub fn cases(
    manifest: &PackageManifest,
) -> &[pko_proto::manifests::PackageManifestTestCaseTemplate] {
    manifest
        .test
        .as_ref()
        .map(|t| t.template.as_slice())
        .unwrap_or_default()
}

/// `validate DIR`: Ok(()) or the error message after `validating package: `.
pub fn validate_dir(dir: &Path) -> Result<(), String> {
    let files = import(dir)?;
    let units = structure(dir, &files).map_err(|e| e.to_string())?;
    as_result(validate_units(&units, true)?)
}

/// `validate --pull`: the checks of an image's files (no template tests, no fixtures).
pub fn validate_files(files: &PackageFiles) -> Result<(), String> {
    if files.is_empty() {
        return Err(Violation::new(reason::EMPTY_PACKAGE).to_string());
    }
    let units = structure(Path::new("."), files).map_err(|e| e.to_string())?;
    as_result(validate_units(&units, false)?)
}

/// The validators' findings as the error upstream reports, one per line.
fn as_result(findings: Vec<String>) -> Result<(), String> {
    if findings.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "loading package from files: {}",
            findings.join("\n")
        ))
    }
}
