//! From package files to a manifest and the objects of each phase: finds and checks the manifest (and
//! lock file), renders `*.gotmpl` and `*.hbs` files, splits YAML streams, and checks every object (apiVersion/kind,
//! phase annotation naming a declared phase, labels, pko's object annotations). Every error names the
//! file and the line where the offending document starts.

use std::collections::BTreeMap;
use std::sync::Arc;

use pko_proto::core::common::{
    CollisionProtection, ConditionMapping, ObjectSetObject, ObjectSetTemplatePhase,
    ObjectSetTemplateSpec,
};
use pko_proto::manifests::{PackageManifest, PackageManifestLock};
use serde_json::Value;

use super::components::{in_component, select_component};
use super::config::admit_config;
use super::files::PackageFiles;
use super::filtering::{Filter, CONDITION_ANNOTATION};
use super::hbs_template::render_hbs;
use super::image_lock::resolve_images;
use super::template::{render, TemplateError};
use super::template_funcs::package_funcs;

/// Annotation naming the phase of an object (required).
pub const PHASE_ANNOTATION: &str = "package-operator.run/phase";
/// Annotation setting an object's collision protection.
pub const COLLISION_ANNOTATION: &str = "package-operator.run/collision-protection";
/// Annotation with condition mappings, one `SourceType => domain/DestinationType` per line.
pub const CONDITION_MAP_ANNOTATION: &str = "package-operator.run/condition-map";

const MANIFEST_FILES: [&str; 2] = ["manifest.yaml", "manifest.yml"];
const LOCK_FILES: [&str; 2] = ["manifest.lock.yaml", "manifest.lock.yml"];

/// Why a package cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackageError {
    #[error("manifest.yaml: not found (nor manifest.yml)")]
    MissingManifest,
    #[error("manifest.yaml: manifest.yml exists too; a package has one manifest")]
    TwoManifests,
    #[error("{file}: {message}")]
    Manifest { file: String, message: String },
    #[error("{file}: {message}")]
    Lock { file: String, message: String },
    #[error("{file}: config rejected by spec.config.openAPIV3Schema: {}", errors.join("; "))]
    Config { file: String, errors: Vec<String> },
    #[error("{file}: spec.component is {component:?}, but the package is not multi-component (no spec.components)")]
    NotMultiComponent { file: String, component: String },
    #[error("component {component:?} not found in components/ (available: {available})")]
    UnknownComponent {
        component: String,
        available: String,
    },
    #[error("component {component:?}: components/{component}/{source}")]
    InComponent {
        component: String,
        source: Box<PackageError>,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("{file}:{line}: {message}")]
    Yaml {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}:{line}: object has no {missing}")]
    MissingGvk {
        file: String,
        line: usize,
        missing: &'static str,
    },
    #[error("{file}:{line}: {object}: missing annotation {PHASE_ANNOTATION}")]
    MissingPhase {
        file: String,
        line: usize,
        object: String,
    },
    #[error("{file}:{line}: {object}: phase {phase:?} is not declared in the manifest (declared: {declared})")]
    UnknownPhase {
        file: String,
        line: usize,
        object: String,
        phase: String,
        declared: String,
    },
    #[error("{file}:{line}: {object}: label {key:?}: {problem}")]
    InvalidLabel {
        file: String,
        line: usize,
        object: String,
        key: String,
        problem: String,
    },
    #[error("{file}:{line}: {object}: annotation {annotation}: {problem}")]
    InvalidAnnotation {
        file: String,
        line: usize,
        object: String,
        annotation: &'static str,
        problem: String,
    },
}

/// A text file of the package: (path, content).
type SourceFile = (String, String);

/// A loaded package.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedPackage {
    pub manifest_file: String,
    pub manifest: PackageManifest,
    pub lock: Option<PackageManifestLock>,
    /// Phases in manifest order, each with its objects in path order.
    pub phases: Vec<ObjectSetTemplatePhase>,
}

impl LoadedPackage {
    /// The ObjectSet template the package's ObjectDeployment carries.
    pub fn template_spec(&self) -> ObjectSetTemplateSpec {
        ObjectSetTemplateSpec {
            phases: self.phases.clone(),
            availability_probes: self.manifest.spec.availability_probes.clone(),
            success_delay_seconds: 0,
        }
    }
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

fn text(file: &str, bytes: &[u8]) -> Result<String, PackageError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| PackageError::Yaml {
        file: file.to_owned(),
        line: 1,
        message: "not UTF-8 text".to_owned(),
    })
}

/// The document upstream reads of a manifest or lock file: the first; later ones are ignored.
fn first_document(text: &str) -> &str {
    split_documents(text).first().map_or("", |(_, doc)| doc)
}

/// Parses one YAML document of a package file as Package Operator does (sigs.k8s.io/yaml): a mapping key
/// given twice keeps its last value.
fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
    };
    serde_saphyr::from_str_with_options(text, options)
}

/// Reads and checks the manifest.
pub fn load_manifest(files: &PackageFiles) -> Result<(String, PackageManifest), PackageError> {
    let (file, bytes) = single_file(files, &MANIFEST_FILES)
        .map_err(|()| PackageError::TwoManifests)?
        .ok_or(PackageError::MissingManifest)?;
    let manifest_err = |message: String| PackageError::Manifest {
        file: file.to_owned(),
        message,
    };
    let manifest: PackageManifest =
        parse_yaml(first_document(&text(file, bytes)?)).map_err(|e| manifest_err(e.to_string()))?;
    let want = format!("{}/{}", pko_proto::MANIFESTS_GROUP, pko_proto::VERSION);
    if manifest.kind != "PackageManifest" || manifest.api_version != want {
        return Err(manifest_err(format!(
            "want apiVersion {want} and kind PackageManifest, got {:?} {:?}",
            manifest.api_version, manifest.kind
        )));
    }
    if manifest.spec.phases.is_empty() {
        return Err(manifest_err(
            "spec.phases: at least one phase is required".to_owned(),
        ));
    }
    Ok((file.to_owned(), manifest))
}

/// Admits a package config against the manifest's schema (pruned, defaulted, validated).
pub fn admit_package_config(
    manifest_file: &str,
    manifest: &PackageManifest,
    config: Option<&Value>,
) -> Result<Value, PackageError> {
    let schema = manifest
        .spec
        .config
        .as_ref()
        .and_then(|c| c.open_api_v3_schema.as_ref())
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| PackageError::Manifest {
            file: manifest_file.to_owned(),
            message: e.to_string(),
        })?;
    admit_config(schema.as_ref(), config).map_err(|errors| PackageError::Config {
        file: manifest_file.to_owned(),
        errors,
    })
}

/// Loads what a (Cluster)Package installs: picks the component (`spec.component`), admits `config`
/// against its manifest, and loads it with the template context `context` builds from the manifest and
/// the admitted config. Errors inside a component name it.
pub fn load_installable(
    files: &PackageFiles,
    component: Option<&str>,
    config: Option<&Value>,
    context: impl FnOnce(&PackageManifest, Value) -> Value,
) -> Result<LoadedPackage, PackageError> {
    let files = select_component(files, component)?;
    let load = || {
        let (manifest_file, manifest) = load_manifest(&files)?;
        let admitted = admit_package_config(&manifest_file, &manifest, config)?;
        load_package(&files, &context(&manifest, admitted))
    };
    load().map_err(|e| in_component(component, e))
}

/// Loads a package: manifest, lock file, rendered templates and the objects of each phase. `context` is
/// the template context (`.package`, `.config`, `.environment`, ...).
pub fn load_package(files: &PackageFiles, context: &Value) -> Result<LoadedPackage, PackageError> {
    let (manifest_file, manifest) = load_manifest(files)?;
    let lock = match single_file(files, &LOCK_FILES) {
        Err(()) => {
            return Err(PackageError::Lock {
                file: LOCK_FILES.join(" and "),
                message: "only one lock file may exist".to_owned(),
            })
        }
        Ok(None) => None,
        Ok(Some((file, bytes))) => Some((
            file,
            parse_yaml::<PackageManifestLock>(first_document(&text(file, bytes)?)).map_err(
                |e| PackageError::Lock {
                    file: file.to_owned(),
                    message: e.to_string(),
                },
            )?,
        )),
    };
    let images = resolve_images(
        &manifest_file,
        &manifest,
        lock.as_ref().map(|(file, lock)| (*file, lock)),
    )?;
    let mut context = context.clone();
    if let Some(map) = context.as_object_mut() {
        map.insert(
            "images".to_owned(),
            serde_json::to_value(&images).unwrap_or_default(),
        );
    }
    let context = &context;
    let lock = lock.map(|(_, lock)| lock);

    // `_`-prefixed files: `.hbs` ones are handlebars partials, the rest gotmpl `define`s.
    let (partials, helpers): (Vec<SourceFile>, Vec<SourceFile>) = files
        .iter()
        .filter(|(path, _)| basename(path).starts_with('_'))
        .map(|(path, bytes)| Ok((path.clone(), text(path, bytes)?)))
        .collect::<Result<Vec<_>, PackageError>>()?
        .into_iter()
        .partition(|(path, _)| path.ends_with(".hbs"));
    let funcs = package_funcs(Arc::new(files.clone()), Arc::new(context.clone()));

    let declared: Vec<&str> = manifest
        .spec
        .phases
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let mut by_phase: BTreeMap<String, Vec<ObjectSetObject>> = BTreeMap::new();
    let filter =
        Filter::new(manifest.spec.conditional_filtering.as_ref(), context).map_err(|message| {
            PackageError::Manifest {
                file: manifest_file.clone(),
                message,
            }
        })?;
    for (path, bytes) in files {
        if MANIFEST_FILES.contains(&path.as_str()) || LOCK_FILES.contains(&path.as_str()) {
            continue;
        }
        if basename(path).starts_with('_') || !filter.keeps_path(path) {
            continue;
        }
        let (name, content) = if let Some(rendered_name) = path.strip_suffix(".gotmpl") {
            (
                rendered_name,
                render(path, &text(path, bytes)?, &helpers, &funcs, context)?,
            )
        } else if let Some(rendered_name) = path.strip_suffix(".hbs") {
            (
                rendered_name,
                render_hbs(path, &text(path, bytes)?, &partials, &funcs, context)?,
            )
        } else {
            (path.as_str(), text(path, bytes)?)
        };
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        for (line, doc) in split_documents(&content) {
            let object: Value = parse_yaml(doc).map_err(|e| PackageError::Yaml {
                file: path.clone(),
                line,
                message: e.to_string(),
            })?;
            if object.is_null() {
                continue;
            }
            let keep = filter
                .keeps_object(&object)
                .map_err(|message| PackageError::Yaml {
                    file: path.clone(),
                    line,
                    message: format!("annotation {CONDITION_ANNOTATION}: {message}"),
                })?;
            if !keep {
                continue;
            }
            let (phase, spec) = check_object(path, line, object, &declared)?;
            by_phase.entry(phase).or_default().push(spec);
        }
    }
    let phases = manifest
        .spec
        .phases
        .iter()
        .map(|p| ObjectSetTemplatePhase {
            name: p.name.clone(),
            class: p.class.clone(),
            objects: by_phase.remove(&p.name).unwrap_or_default(),
            external_objects: Vec::new(),
            slices: Vec::new(),
        })
        .collect();
    Ok(LoadedPackage {
        manifest_file,
        manifest,
        lock,
        phases,
    })
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Splits a YAML stream at `---` lines; yields (1-based line where the document starts, document).
pub fn split_documents(content: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let mut start_byte = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (i, line) in content.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") {
            docs.push((start_line, &content[start_byte..offset]));
            start_byte = offset + line.len();
            start_line = i + 2;
        }
        offset += line.len();
    }
    docs.push((start_line, &content[start_byte..]));
    docs.into_iter()
        .filter(|(_, d)| !d.trim().is_empty())
        .collect()
}

fn check_object(
    file: &str,
    line: usize,
    object: Value,
    declared: &[&str],
) -> Result<(String, ObjectSetObject), PackageError> {
    let at = || (file.to_owned(), line);
    for (field, missing) in [("apiVersion", "apiVersion"), ("kind", "kind")] {
        if object
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(PackageError::MissingGvk {
                file: at().0,
                line,
                missing,
            });
        }
    }
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let label = format!("{kind} {name}");
    let annotations = |key: &str| {
        object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
    };
    let phase = annotations(PHASE_ANNOTATION)
        .ok_or_else(|| PackageError::MissingPhase {
            file: at().0,
            line,
            object: label.clone(),
        })?
        .to_owned();
    if !declared.contains(&phase.as_str()) {
        return Err(PackageError::UnknownPhase {
            file: at().0,
            line,
            object: label,
            phase,
            declared: declared.join(", "),
        });
    }
    if let Some(labels) = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        for (key, value) in labels {
            let problem = check_label_key(key)
                .err()
                .or_else(|| check_label_value(value.as_str().unwrap_or("\u{0}")).err());
            if let Some(problem) = problem {
                return Err(PackageError::InvalidLabel {
                    file: at().0,
                    line,
                    object: label,
                    key: key.clone(),
                    problem,
                });
            }
        }
    }
    let invalid_annotation =
        |annotation: &'static str, problem: String| PackageError::InvalidAnnotation {
            file: file.to_owned(),
            line,
            object: label.clone(),
            annotation,
            problem,
        };
    let collision_protection = match annotations(COLLISION_ANNOTATION) {
        None => CollisionProtection::default(),
        Some(v) => {
            let parsed: CollisionProtection =
                serde_json::from_value(Value::String(v.to_owned()))
                    .map_err(|e| invalid_annotation(COLLISION_ANNOTATION, e.to_string()))?;
            if !parsed.is_known() {
                return Err(invalid_annotation(
                    COLLISION_ANNOTATION,
                    format!("{v:?} is not Prevent, IfNoController or None"),
                ));
            }
            parsed
        }
    };
    let condition_mappings = match annotations(CONDITION_MAP_ANNOTATION) {
        None => Vec::new(),
        Some(v) => {
            parse_condition_map(v).map_err(|p| invalid_annotation(CONDITION_MAP_ANNOTATION, p))?
        }
    };
    Ok((
        phase,
        ObjectSetObject {
            object,
            collision_protection,
            condition_mappings,
        },
    ))
}

/// Parses `SourceType => domain/DestinationType` lines.
pub fn parse_condition_map(text: &str) -> Result<Vec<ConditionMapping>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (source, destination) = line.split_once("=>").ok_or_else(|| {
                format!("line {line:?}: want `SourceType => domain/DestinationType`")
            })?;
            let (source, destination) = (source.trim(), destination.trim());
            if source.is_empty() || !destination.contains('/') {
                return Err(format!(
                    "line {line:?}: want `SourceType => domain/DestinationType`"
                ));
            }
            Ok(ConditionMapping {
                source_type: source.to_owned(),
                destination_type: destination.to_owned(),
            })
        })
        .collect()
}

fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !part.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && part
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

/// Kubernetes label key rules: optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Err(format!("prefix {prefix:?} is not a DNS subdomain"));
        }
    }
    if !is_label_name(name) {
        return Err(format!("name {name:?} must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"));
    }
    Ok(())
}

/// Kubernetes label value rules: empty, or a name of at most 63 characters.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!("value {value:?} must be empty or 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn documents_split_at_separator_lines_with_their_start_lines() {
        let docs = split_documents("a: 1\n---\nb: 2\n--- # comment\n\n---\nc: 3\n");
        assert_eq!(docs, vec![(1, "a: 1\n"), (3, "b: 2\n"), (7, "c: 3\n")]);
        assert_eq!(split_documents("---\nx: 1\n"), vec![(2, "x: 1\n")]);
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value_as_upstream_does() {
        let object: Value =
            parse_yaml("kind: ConfigMap\ndata:\n  greeting: hi\n  greeting: hello\n").unwrap();
        assert_eq!(object["data"], json!({"greeting": "hello"}));
        let manifest: PackageManifest = parse_yaml(
            "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\n\
             metadata: {name: first}\nmetadata: {name: second}\nspec: {scopes: [Namespaced], phases: []}\n",
        )
        .unwrap();
        assert_eq!(manifest.metadata.name.as_deref(), Some("second"));
    }

    #[test]
    fn a_manifest_file_is_its_first_document() {
        let text = "---\napiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\n\
                    metadata: {name: first}\nspec: {scopes: [Namespaced], phases: []}\n---\nignored: [\n";
        let manifest: PackageManifest = parse_yaml(first_document(text)).unwrap();
        assert_eq!(manifest.metadata.name.as_deref(), Some("first"));
        assert_eq!(first_document(""), "");
    }

    #[test]
    fn condition_maps_parse_and_reject_garbage() {
        assert_eq!(
            parse_condition_map("Available => my.domain/Available\n\n Ready=>x/Ready ").unwrap(),
            vec![
                ConditionMapping {
                    source_type: "Available".into(),
                    destination_type: "my.domain/Available".into()
                },
                ConditionMapping {
                    source_type: "Ready".into(),
                    destination_type: "x/Ready".into()
                },
            ]
        );
        assert!(parse_condition_map("Available -> x/Y").is_err());
        assert!(parse_condition_map("Available => NoDomain").is_err());
    }

    #[test]
    fn label_rules() {
        assert!(check_label_key("app.kubernetes.io/name").is_ok());
        assert!(check_label_key("simple").is_ok());
        assert!(check_label_key("Bad_Prefix/x").is_err());
        assert!(check_label_key(&"a".repeat(64)).is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("-leading").is_err());
    }

    #[test]
    fn objects_land_in_their_phase_in_path_order() {
        let manifest = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: p}\nspec:\n  phases: [{name: a}, {name: b}]\n";
        let cm = |name: &str, phase: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  annotations: {{package-operator.run/phase: {phase}}}\n")
        };
        let mut files = PackageFiles::new();
        files.insert("manifest.yaml".into(), manifest.into());
        files.insert("z.yaml".into(), cm("z", "a").into());
        files.insert(
            "dir/b.yml".into(),
            format!("{}---\n{}", cm("b1", "b"), cm("b2", "b")).into(),
        );
        files.insert("notes.txt".into(), b"ignored".to_vec());
        let loaded = load_package(&files, &json!({})).unwrap();
        let names: Vec<Vec<&str>> = loaded
            .phases
            .iter()
            .map(|p| {
                p.objects
                    .iter()
                    .map(|o| o.object["metadata"]["name"].as_str().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(names, vec![vec!["z"], vec!["b1", "b2"]]);
        assert_eq!(loaded.template_spec().phases.len(), 2);
    }

    proptest! {
        /// Any label name the apiserver would accept as a plain key is accepted, and vice versa for junk.
        #[test]
        fn generated_valid_names_pass(name in "[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?") {
            prop_assert!(check_label_key(&name).is_ok());
            prop_assert!(check_label_value(&name).is_ok());
        }

        #[test]
        fn names_with_spaces_fail(name in "[a-z]{1,10} [a-z]{1,10}") {
            prop_assert!(check_label_key(&name).is_err());
        }
    }
}
