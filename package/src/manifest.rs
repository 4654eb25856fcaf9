//! The PackageManifest and its lock file: finding them among a package's files, parsing them as upstream
//! does (first document, apiVersion and kind checked before the body), validating them with upstream's
//! field errors, and the package loading error every other module reports through. Pure.

use pko_proto::manifests::{PackageManifest, PackageManifestLock};
use serde_json::Value;

use crate::config::{check_config, field_error_aggregate};
use crate::files::PackageFiles;
use crate::template::TemplateError;
use crate::violation::{reason, Violation};
use crate::yaml::{first_document, parse_yaml};

pub(crate) const MANIFEST_FILES: [&str; 2] = ["manifest.yaml", "manifest.yml"];
pub(crate) const LOCK_FILES: [&str; 2] = ["manifest.lock.yaml", "manifest.lock.yml"];

/// Why a package cannot be loaded, in upstream's words (see `violation.rs`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageError {
    /// Violations of the package's structure or objects, one per line.
    #[error("{}", join_lines(.0))]
    Violations(Vec<Violation>),
    /// Kubernetes field errors (manifest validation, config admission): one bare, several as `[a, b]`.
    #[error("{}", field_error_aggregate(.0))]
    Fields(Vec<String>),
    /// Several failed checks, one per line.
    #[error("{}", join_lines(.0))]
    Joined(Vec<PackageError>),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("component \"{component}\": {source}")]
    InComponent {
        component: String,
        source: Box<PackageError>,
    },
}

impl From<Violation> for PackageError {
    fn from(v: Violation) -> Self {
        PackageError::Violations(vec![v])
    }
}

impl PackageError {
    /// All of `errors` as one error (None when there are none).
    pub fn join(mut errors: Vec<PackageError>) -> Option<PackageError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(PackageError::Joined(errors)),
        }
    }
}

fn join_lines<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

fn single_file<'a>(
    files: &'a PackageFiles,
    names: &[&'static str],
) -> Result<Option<(&'static str, &'a [u8])>, ()> {
    let found: Vec<(&'static str, &[u8])> = names
        .iter()
        .filter_map(|n| files.get(*n).map(|b| (*n, b.as_slice())))
        .collect();
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        _ => Err(()),
    }
}

pub(crate) fn text(file: &str, bytes: &[u8]) -> Result<String, PackageError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| {
        Violation::new(reason::INVALID_YAML)
            .in_file(file)
            .details("not UTF-8 text")
            .into()
    })
}

/// Parses a manifest or lock file: first document, apiVersion and kind checked before the body.
fn parse_manifest_file<T: serde::de::DeserializeOwned>(
    file: &str,
    bytes: &[u8],
    kind: &str,
) -> Result<T, PackageError> {
    let text = text(file, bytes)?;
    let document = first_document(&text);
    let invalid = |e: &dyn std::fmt::Display| -> PackageError {
        Violation::new(reason::INVALID_YAML)
            .in_file(file)
            .details(e.to_string())
            .into()
    };
    let raw: Value = parse_yaml(document).map_err(|e| invalid(&e))?;
    let field = |name: &str| raw.get(name).and_then(Value::as_str).unwrap_or_default();
    let (group, version) = match field("apiVersion").rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", field("apiVersion")),
    };
    let unknown_gvk = |details: String| -> PackageError {
        Violation::new(reason::UNKNOWN_GVK)
            .in_file(file)
            .details(details)
            .into()
    };
    if group != pko_proto::MANIFESTS_GROUP || field("kind") != kind {
        let is = if group.is_empty() {
            field("kind").to_owned()
        } else {
            format!("{}.{group}", field("kind"))
        };
        return Err(unknown_gvk(format!(
            "GroupKind must be {kind}.{}, is: {is}",
            pko_proto::MANIFESTS_GROUP
        )));
    }
    if version != pko_proto::VERSION {
        return Err(unknown_gvk(format!(
            "unknown version {version}, supported versions: {}",
            pko_proto::VERSION
        )));
    }
    serde_json::from_value(raw).map_err(|e| invalid(&e))
}

/// Reads the manifest and checks its content (upstream's manifest validation).
pub fn load_manifest(files: &PackageFiles) -> Result<(String, PackageManifest), PackageError> {
    let (file, manifest) = parse_manifest(files)?;
    let errors = manifest_errors(&manifest);
    if !errors.is_empty() {
        return Err(PackageError::Fields(errors));
    }
    Ok((file, manifest))
}

/// Reads the manifest without checking its content (upstream's structural load).
pub fn parse_manifest(files: &PackageFiles) -> Result<(String, PackageManifest), PackageError> {
    let (file, bytes) = single_file(files, &MANIFEST_FILES)
        .map_err(|()| PackageError::from(Violation::new(reason::MANIFEST_DUPLICATED)))?
        .ok_or_else(|| {
            Violation::new(reason::MANIFEST_NOT_FOUND)
                .details("searched at manifest.yaml and manifest.yml")
        })?;
    let manifest = parse_manifest_file(file, bytes, "PackageManifest")?;
    Ok((file.to_owned(), manifest))
}

/// Upstream's PackageManifest validation, as field errors.
pub fn manifest_errors(manifest: &PackageManifest) -> Vec<String> {
    let mut errors = Vec::new();
    if manifest.metadata.name.as_deref().is_none_or(str::is_empty) {
        errors.push("metadata.name: Required value".to_owned());
    }
    if manifest.spec.scopes.is_empty() {
        errors.push("spec.scopes: Required value".to_owned());
    }
    if manifest.spec.phases.is_empty() {
        errors.push("spec.phases: Required value".to_owned());
    }
    let mut seen = Vec::new();
    for (i, phase) in manifest.spec.phases.iter().enumerate() {
        if seen.contains(&phase.name.as_str()) {
            errors.push(format!(
                "spec.phases[{i}].name: Invalid value: {:?}: must be unique",
                phase.name
            ));
        }
        seen.push(&phase.name);
    }
    for (i, probe) in manifest.spec.availability_probes.iter().enumerate() {
        if probe.probes.is_empty() {
            errors.push(format!(
                "spec.availabilityProbes[{i}].probes: Required value"
            ));
        }
    }
    let mut names = Vec::new();
    for (i, image) in manifest.spec.images.iter().enumerate() {
        if image.name.is_empty() {
            errors.push(format!(
                "spec.images[{i}].name: Invalid value: \"\": must be non empty"
            ));
        } else if names.contains(&image.name.as_str()) {
            errors.push(format!(
                "spec.images[{i}].name: Invalid value: {:?}: must be unique",
                image.name
            ));
        } else {
            names.push(&image.name);
        }
        if image.image.is_empty() {
            errors.push(format!(
                "spec.images[{i}].image: Invalid value: \"\": must be non empty"
            ));
        }
    }
    let schema = config_schema(manifest);
    if let Some(test) = &manifest.test {
        for (i, case) in test.template.iter().enumerate() {
            if let Some(problem) = config_map_key_problem(&case.name) {
                errors.push(format!(
                    "test.template[{i}].name: Invalid value: {:?}: {problem}",
                    case.name
                ));
            }
            if let Some(schema) = &schema {
                let config = case
                    .context
                    .config
                    .clone()
                    .unwrap_or_else(|| Value::Object(Default::default()));
                let root = format!("test.template[{i}].context.config");
                if let Err(e) = check_config(schema, &config, &root) {
                    errors.extend(e);
                }
            }
        }
        if test
            .kubeconform
            .as_ref()
            .is_some_and(|k| k.kubernetes_version.is_empty())
        {
            errors.push("test.kubeconform.kubernetesVersion: Required value".to_owned());
        }
    }
    errors
}

/// Kubernetes' ConfigMap key rule (what a test-template name must satisfy).
fn config_map_key_problem(key: &str) -> Option<&'static str> {
    let valid_chars = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if key.is_empty() || key.len() > 253 || !valid_chars {
        Some("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')")
    } else if key == "." || key == ".." || key.starts_with("..") {
        Some("must not be '.' or '..' and must not start with '..'")
    } else {
        None
    }
}

/// The manifest's config schema as JSON (None: the package takes no config).
pub fn config_schema(manifest: &PackageManifest) -> Option<Value> {
    manifest
        .spec
        .config
        .as_ref()
        .and_then(|c| c.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
}

/// Reads the lock file, if the package has one.
pub fn load_lock(
    files: &PackageFiles,
) -> Result<Option<(&'static str, PackageManifestLock)>, PackageError> {
    match single_file(files, &LOCK_FILES) {
        Err(()) => Err(Violation::new(reason::LOCK_DUPLICATED).into()),
        Ok(None) => Ok(None),
        Ok(Some((file, bytes))) => {
            let lock: PackageManifestLock =
                parse_manifest_file(file, bytes, "PackageManifestLock")?;
            let errors = lock_errors(&lock);
            if !errors.is_empty() {
                return Err(Violation::new(reason::LOCK_INVALID)
                    .in_file(file)
                    .details(field_error_aggregate(&errors))
                    .into());
            }
            Ok(Some((file, lock)))
        }
    }
}

/// Every lock entry has a name, an image and a digest; names are unique.
fn lock_errors(lock: &PackageManifestLock) -> Vec<String> {
    let mut errors = Vec::new();
    let mut names = Vec::new();
    for (i, image) in lock.spec.images.iter().enumerate() {
        for (field, value) in [
            ("name", &image.name),
            ("image", &image.image),
            ("digest", &image.digest),
        ] {
            if value.is_empty() {
                errors.push(format!("spec.images[{i}].{field}: Required value"));
            }
        }
        if !image.name.is_empty() {
            if names.contains(&image.name.as_str()) {
                errors.push(format!(
                    "spec.images[{i}].name: Invalid value: {:?}: must be unique",
                    image.name
                ));
            }
            names.push(&image.name);
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_entries_need_name_image_and_digest() {
        let lock = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifestLock\nspec:\n  images:\n  - {name: a, image: img-x}\n  - {name: a, image: img-y, digest: 'sha256:1'}\n";
        let files: PackageFiles =
            [("manifest.lock.yaml".to_owned(), lock.as_bytes().to_vec())].into();
        assert_eq!(
            load_lock(&files).unwrap_err().to_string(),
            "PackageManifestLock invalid in manifest.lock.yaml: [spec.images[0].digest: Required value, spec.images[1].name: Invalid value: \"a\": must be unique]"
        );
    }
}
