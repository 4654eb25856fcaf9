//! From package files to a manifest and the objects of each phase: finds and checks the manifest (and
//! lock file), renders `*.gotmpl` and `*.hbs` files, splits object files as Package Operator does, and
//! checks every object (`object_checks`). Problems are reported in upstream's words, naming the file and
//! document index, all of them at once. Manager and `kubectl-package` share this loader; it must not do I/O.

use pko_proto::well_known::{CONDITION_ANNOTATION, INSTANCE_LABEL, PACKAGE_LABEL};
use std::collections::BTreeMap;
use std::sync::Arc;

use pko_proto::core::common::{ObjectSetObject, ObjectSetTemplatePhase, ObjectSetTemplateSpec};
use pko_proto::manifests::{PackageManifest, PackageManifestLock};
use serde_json::Value;

use super::components::{in_component, select_component};
use super::config::{admit_config, PACKAGE_CONFIG_PATH};
use super::files::PackageFiles;
use super::filtering::Filter;
use super::hbs_template::render_hbs;
use super::image_lock::resolve_images;
use super::manifest::{
    config_schema, load_lock, load_manifest, text, PackageError, LOCK_FILES, MANIFEST_FILES,
};
use super::object_checks::{check_object, duplicate_objects};
use super::template::render;
use super::template_funcs::package_funcs;
use super::violation::{reason, Violation};
use super::yaml::{first_document, parse_yaml, split_object_file};
use gotmpl::FuncMap;

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
    /// Rendered YAML files that held at least one object, before CEL filtering (path after rendering,
    /// e.g. `cm.yaml` for `cm.yaml.gotmpl`) with their rendered text: what template tests compare.
    pub object_files: BTreeMap<String, RenderedFile>,
}

/// A rendered object file and what of it survived CEL filtering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFile {
    /// The rendered text, unfiltered.
    pub text: String,
    /// The documents (trimmed) the condition annotation kept, or None when it kept them all.
    pub kept: Option<Vec<String>>,
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

/// Whether `*.gotmpl`/`*.hbs` files are rendered. Upstream's `validate` and `build` never render a
/// package that has no test templates: only its static YAML files are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Render {
    Templates,
    StaticOnly,
}

/// What templates see as `.images.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Images {
    /// `repository@digest` from the lock file (what a Package installs).
    Locked,
    /// Every image as upstream's CLI renders it: `registry.package-operator.run/static-image`.
    Static,
}

/// The image templates see for every `spec.images` entry when the CLI renders a package.
pub const STATIC_IMAGE: &str = "registry.package-operator.run/static-image";

/// Admits a package config against the manifest's schema (pruned, defaulted, validated); errors name
/// fields under `spec.config`.
pub fn admit_package_config(
    manifest: &PackageManifest,
    config: Option<&Value>,
) -> Result<Value, PackageError> {
    admit_config(
        config_schema(manifest).as_ref(),
        config,
        PACKAGE_CONFIG_PATH,
    )
    .map_err(PackageError::Fields)
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
        let (_, manifest) = load_manifest(&files)?;
        let admitted = admit_package_config(&manifest, config)?;
        load_package(&files, &context(&manifest, admitted))
    };
    load().map_err(|e| in_component(component, e))
}

/// Loads a package with its templates rendered: manifest, lock file and the objects of each phase.
/// `context` is the template context (`.package`, `.config`, `.environment`, ...).
pub fn load_package(files: &PackageFiles, context: &Value) -> Result<LoadedPackage, PackageError> {
    load_package_with(files, context, Render::Templates, Images::Locked)
}

/// Loads a package; `render_mode` says whether templates are rendered or skipped, `image_mode` what
/// they see as `.images`.
pub fn load_package_with(
    files: &PackageFiles,
    context: &Value,
    render_mode: Render,
    image_mode: Images,
) -> Result<LoadedPackage, PackageError> {
    let (manifest_file, manifest) = load_manifest(files)?;
    let lock = load_lock(files)?;
    let mut images = resolve_images(&manifest, lock.as_ref().map(|(file, lock)| (*file, lock)))?;
    if image_mode == Images::Static {
        images
            .values_mut()
            .for_each(|i| *i = STATIC_IMAGE.to_owned());
    }
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
        .filter(|(path, _)| path.ends_with(".gotmpl") || path.ends_with(".hbs"))
        .map(|(path, bytes)| Ok((path.clone(), text(path, bytes)?)))
        .collect::<Result<Vec<_>, PackageError>>()?
        .into_iter()
        .partition(|(path, _)| path.ends_with(".hbs"));
    let funcs = package_funcs(Arc::new(files.clone()), Arc::new(context.clone()));
    // Without rendering nothing is filtered: every static object is checked.
    let filter = match render_mode {
        Render::StaticOnly => None,
        Render::Templates => Some(
            Filter::new(manifest.spec.conditional_filtering.as_ref(), context).map_err(
                |message| {
                    PackageError::from(
                        Violation::new(reason::MANIFEST_INVALID)
                            .in_file(manifest_file.clone())
                            .details(message),
                    )
                },
            )?,
        ),
    };

    let sources = TemplateSources {
        partials: &partials,
        helpers: &helpers,
        funcs: &funcs,
        context,
    };
    let rendered = render_files(files, render_mode, &sources)?;

    let instance = context
        .pointer("/package/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let labels = PackageLabels {
        manifest_name: manifest.metadata.name.clone().unwrap_or_default(),
        instance,
    };
    let Collected {
        objects,
        object_files,
        mut violations,
    } = collect_objects(rendered, filter.as_ref(), &labels);

    let declared: Vec<&str> = manifest
        .spec
        .phases
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    violations.extend(duplicate_objects(&objects));
    let mut by_phase: BTreeMap<String, Vec<ObjectSetObject>> = BTreeMap::new();
    for (path, index, object) in objects {
        match check_object(&path, index, object, &declared) {
            Ok((phase, spec)) => by_phase.entry(phase).or_default().push(spec),
            Err(mut found) => violations.append(&mut found),
        }
    }
    if !violations.is_empty() {
        // Upstream runs its validators one after the other: GVK, then labels, then phases.
        violations.sort_by_key(|v| validator_rank(v.reason));
        return Err(PackageError::Violations(violations));
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
        object_files,
    })
}

/// What templates are rendered with: partials (`.hbs`) and `define`s (`.gotmpl`) of `_`-prefixed files,
/// the template functions and the context.
struct TemplateSources<'a> {
    partials: &'a [SourceFile],
    helpers: &'a [SourceFile],
    funcs: &'a FuncMap,
    context: &'a Value,
}

/// Every file objects may come from, by name: templates rendered (unless `render_mode` skips them) under
/// their name without the template suffix, and static object files not replaced by a template's output.
fn render_files(
    files: &PackageFiles,
    render_mode: Render,
    sources: &TemplateSources<'_>,
) -> Result<BTreeMap<String, String>, PackageError> {
    let TemplateSources {
        partials,
        helpers,
        funcs,
        context,
    } = sources;
    // Rendered files first: a template's output replaces a static file of the same name.
    let mut rendered: BTreeMap<String, String> = BTreeMap::new();
    for (path, bytes) in files {
        if MANIFEST_FILES.contains(&path.as_str()) || LOCK_FILES.contains(&path.as_str()) {
            continue;
        }
        let template = if let Some(name) = path.strip_suffix(".gotmpl") {
            Some((name, false))
        } else {
            path.strip_suffix(".hbs").map(|name| (name, true))
        };
        match template {
            Some((name, hbs)) => {
                if render_mode == Render::StaticOnly || basename(path).starts_with('_') {
                    continue;
                }
                let source = text(path, bytes)?;
                let content = if hbs {
                    render_hbs(path, &source, partials, funcs, context)?
                } else {
                    render(path, &source, helpers, funcs, context)?
                };
                rendered.insert(name.to_owned(), content);
            }
            None => {
                if !rendered.contains_key(path) && is_object_file(path) {
                    rendered.insert(path.clone(), text(path, bytes)?);
                }
            }
        }
    }

    Ok(rendered)
}

/// The labels every object of a package gets.
struct PackageLabels<'a> {
    manifest_name: String,
    /// The package instance's name.
    instance: &'a str,
}

/// The objects of a package's files, in upstream's order: each with its file and index there, the files
/// they came from (and what a filter kept of each), and what was wrong with the documents.
struct Collected {
    objects: Vec<(String, usize, Value)>,
    object_files: BTreeMap<String, RenderedFile>,
    violations: Vec<Violation>,
}

/// Parses the object files among `rendered`, keeps what `filter` keeps, and labels the objects.
fn collect_objects(
    rendered: BTreeMap<String, String>,
    filter: Option<&Filter>,
    labels: &PackageLabels<'_>,
) -> Collected {
    let mut violations = Vec::new();
    let mut objects: Vec<(String, usize, Value)> = Vec::new();
    let mut object_files = BTreeMap::new();
    // Objects in upstream's order: by path, `/` before every other character, then document order.
    let mut rendered: Vec<(String, String)> = rendered.into_iter().collect();
    rendered.sort_by_cached_key(|(name, _)| name.replace('/', "\0"));
    for (name, content) in rendered {
        if !is_object_file(&name) || filter.is_some_and(|f| !f.keeps_path(&name)) {
            continue;
        }
        let mut index = 0;
        let mut kept = Vec::new();
        let mut filtered_any = false;
        for (part, doc) in split_object_file(&content).into_iter().enumerate() {
            let object = match parse_document(&name, part, doc) {
                Ok(Some(object)) => object,
                Ok(None) => continue,
                Err(violation) => {
                    violations.push(*violation);
                    continue;
                }
            };
            let at = index;
            index += 1;
            let keep = match filter.map_or(Ok(true), |f| f.keeps_object(&object)) {
                Ok(keep) => keep,
                Err(message) => {
                    violations.push(
                        Violation::new(reason::ANNOTATION_INVALID)
                            .at(name.clone(), at)
                            .details(format!("{CONDITION_ANNOTATION}: {message}")),
                    );
                    continue;
                }
            };
            if !keep {
                filtered_any = true;
                continue;
            }
            kept.push(doc.trim().to_owned());
            let mut object = object;
            add_package_labels(&mut object, &labels.manifest_name, labels.instance);
            objects.push((name.clone(), at, object));
        }
        if index > 0 || filtered_any {
            object_files.insert(
                name,
                RenderedFile {
                    text: content,
                    kept: filtered_any.then_some(kept),
                },
            );
        }
    }

    Collected {
        objects,
        object_files,
        violations,
    }
}

/// One document of an object file: the object, `None` for an empty document, or why it is no object
/// (not YAML, not a map, no kind), as upstream words it.
fn parse_document(name: &str, part: usize, doc: &str) -> Result<Option<Value>, Box<Violation>> {
    let invalid = |details: String| {
        Box::new(
            Violation::new(reason::INVALID_YAML)
                .at(name.to_owned(), part)
                .details(details)
                .subject(doc),
        )
    };
    match parse_yaml::<Value>(first_document(doc)) {
        Ok(Value::Null) => Ok(None),
        // Absent, null or empty: Kubernetes' decoder finds no kind in all three.
        Ok(Value::Object(map))
            if map
                .get("kind")
                .is_none_or(|kind| kind.is_null() || kind.as_str() == Some("")) =>
        {
            let json = serde_json::to_string(&map).unwrap_or_default();
            Err(invalid(format!("error unmarshaling JSON: while decoding JSON: Object 'Kind' is missing in '{json}'")))
        }
        Ok(object @ Value::Object(_)) => Ok(Some(object)),
        Ok(other) => Err(invalid(format!(
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
            json_type(&other)
        ))),
        Err(e) => Err(invalid(e.to_string())),
    }
}

/// The order upstream's validators run in (parse errors first, pko's own checks last).
fn validator_rank(reason: &str) -> usize {
    [
        reason::INVALID_YAML,
        reason::DUPLICATE_OBJECT,
        reason::MISSING_GVK,
        reason::LABELS_INVALID,
        reason::MISSING_PHASE_ANNOTATION,
    ]
    .iter()
    .position(|r| *r == reason)
    .unwrap_or(usize::MAX)
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Null | Value::Object(_) => "object",
    }
}

/// A rendered file that holds objects: `.yaml`/`.yml`, not a `_` helper.
fn is_object_file(path: &str) -> bool {
    (path.ends_with(".yaml") || path.ends_with(".yml")) && !basename(path).starts_with('_')
}

/// Every object carries the manifest's and the package instance's name, as upstream labels them.
fn add_package_labels(object: &mut Value, manifest_name: &str, instance: &str) {
    let Some(metadata) = object.as_object_mut().map(|o| {
        o.entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()))
    }) else {
        return;
    };
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(PACKAGE_LABEL.to_owned(), Value::from(manifest_name));
        labels.insert(INSTANCE_LABEL.to_owned(), Value::from(instance));
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_land_in_their_phase_in_path_order() {
        let manifest = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: p}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: a}, {name: b}]\n";
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

    fn package(files: &[(&str, &str)]) -> PackageFiles {
        let manifest = "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: p}\nspec:\n  scopes: [Namespaced]\n  phases: [{name: a}]\n";
        std::iter::once(("manifest.yaml", manifest))
            .chain(files.iter().copied())
            .map(|(p, c)| (p.to_owned(), c.as_bytes().to_vec()))
            .collect()
    }

    fn error(files: &[(&str, &str)]) -> String {
        load_package(
            &package(files),
            &json!({"package": {"metadata": {"name": "inst"}}}),
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn object_violations_are_all_reported_in_upstream_words() {
        let phased = "  annotations: {package-operator.run/phase: a}\n";
        let files = [
            ("a.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  annotations: {package-operator.run/phase: a}\n"),
            ("b.yaml", &*format!("kind: Secret\nmetadata:\n  name: s\n{phased}")),
            ("c.yaml", &*format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: l\n  labels: {{\"bad key!\": v}}\n{phased}")),
        ];
        assert_eq!(
            error(&files),
            "Duplicate Object in a.yaml idx 1\n\
             GroupVersionKind not set in b.yaml idx 0\n\
             Labels invalid in c.yaml idx 0: metadata.labels: Invalid value: \"bad key!\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')\n\
             Missing package-operator.run/phase Annotation in a.yaml idx 0"
        );
        assert_eq!(
            error(&[("d.yaml", "{}\n")]),
            "Invalid YAML in d.yaml idx 0: error unmarshaling JSON: while decoding JSON: Object 'Kind' is missing in '{}'\n{}"
        );
        for kind in ["kind:", "kind: ''"] {
            let missing = error(&[("e.yaml", &*format!("apiVersion: v1\n{kind}\n"))]);
            assert!(
                missing.starts_with("Invalid YAML in e.yaml idx 0: error unmarshaling JSON: while decoding JSON: Object 'Kind' is missing in '{\"apiVersion\":\"v1\",\"kind\":"),
                "{kind}: {missing}"
            );
        }
    }

    #[test]
    fn manifests_are_checked_for_kind_version_and_content() {
        let with = |m: &str| {
            let files: PackageFiles = [("manifest.yaml".to_owned(), m.as_bytes().to_vec())].into();
            load_manifest(&files).unwrap_err().to_string()
        };
        assert_eq!(
            with("apiVersion: banana/v3\nkind: Bread\n"),
            "unknown GVK in manifest.yaml: GroupKind must be PackageManifest.manifests.package-operator.run, is: Bread.banana"
        );
        assert_eq!(
            with("apiVersion: manifests.package-operator.run/v500\nkind: PackageManifest\n"),
            "unknown GVK in manifest.yaml: unknown version v500, supported versions: v1alpha1"
        );
        assert_eq!(
            with("apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {name: p}\nspec:\n  phases: [{name: a}]\n"),
            "spec.scopes: Required value"
        );
        assert_eq!(
            with("apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nspec: {}\n"),
            "[metadata.name: Required value, spec.scopes: Required value, spec.phases: Required value]"
        );
        assert_eq!(
            load_manifest(&PackageFiles::new()).unwrap_err().to_string(),
            "PackageManifest not found: searched at manifest.yaml and manifest.yml"
        );
    }

    #[test]
    fn object_files_split_like_upstream_and_objects_carry_package_labels() {
        assert_eq!(
            split_object_file("---\na: 1\n---\n\n---\nb: 2\n--- # c\nc: 3\n---\n"),
            vec!["a: 1", "", "b: 2\n--- # c\nc: 3"]
        );
        let cm = |name: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  annotations: {{package-operator.run/phase: a}}\n")
        };
        let text = format!(
            "{}---\n\n---\n{}--- # second document of a part is dropped\n{}",
            cm("one"),
            cm("two"),
            cm("dropped")
        );
        let loaded = load_package(
            &package(&[("cms.yaml", &text)]),
            &json!({"package": {"metadata": {"name": "inst"}}}),
        )
        .unwrap();
        let objects = &loaded.phases[0].objects;
        assert_eq!(objects.len(), 2);
        assert_eq!(
            objects[1].object["metadata"]["labels"],
            json!({"package-operator.run/package": "p", "package-operator.run/instance": "inst"})
        );
    }
}
