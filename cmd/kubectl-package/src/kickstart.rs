//! `kickstart`: a new package from existing Kubernetes objects, as upstream lays it out. Each object
//! goes to a preset phase by its group and kind (`<phase>/<name>.<kind>.yaml`), namespaces the objects
//! use get Namespace objects, and the manifest lists the phases used (in preset order), both scopes,
//! and availability probes for the kinds that have known ones. With `-p`, chosen fields become config
//! (`*.yaml.gotmpl` files, a config schema whose defaults reproduce the input, a `defaults` test case);
//! only fields the input has are parametrized.
//!
//! `plan` is pure (objects in, files out); reading inputs and writing the folder are at the bottom.

use pko_proto::well_known::PHASE_ANNOTATION;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use pko_package::object_checks::object_gvk;
use serde_json::{json, Map, Value};

/// Upstream's preset phases, in order.
const PHASES: [&str; 8] = [
    "namespaces",
    "policies",
    "rbac",
    "crds",
    "storage",
    "deploy",
    "publish",
    "other",
];

/// (group, kind) → preset phase.
fn phase_of(group: &str, kind: &str) -> &'static str {
    match (group, kind) {
        ("", "Namespace") => "namespaces",
        ("", "ResourceQuota" | "LimitRange")
        | ("scheduling.k8s.io", "PriorityClass")
        | ("networking.k8s.io", "NetworkPolicy")
        | ("autoscaling", "HorizontalPodAutoscaler")
        | ("policy", "PodDisruptionBudget") => "policies",
        ("", "ServiceAccount")
        | (
            "rbac.authorization.k8s.io",
            "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding",
        ) => "rbac",
        ("apiextensions.k8s.io", "CustomResourceDefinition") => "crds",
        ("", "PersistentVolume" | "PersistentVolumeClaim") | ("storage.k8s.io", "StorageClass") => {
            "storage"
        }
        ("apps", "Deployment" | "DaemonSet" | "StatefulSet")
        | ("", "ReplicaSet" | "Pod" | "Service" | "Secret" | "ConfigMap")
        | ("batch", "Job" | "CronJob") => "deploy",
        ("networking.k8s.io", "Ingress")
        | ("apiregistration.k8s.io", "APIService")
        | ("route.openshift.io", "Route")
        | (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration",
        ) => "publish",
        _ => "other",
    }
}

/// The availability probes of a kind with known ones.
fn probes_of(group: &str, kind: &str) -> Option<Value> {
    let available = json!({"condition": {"type": "Available", "status": "True"}});
    let updated =
        json!({"fieldsEqual": {"fieldA": ".status.updatedReplicas", "fieldB": ".status.replicas"}});
    let cel = |rule: &str, message: &str| json!({"cel": {"rule": rule, "message": message}});
    let probes = match (group, kind) {
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") => vec![available, updated],
        ("apps", "DaemonSet") => vec![json!({"fieldsEqual": {
            "fieldA": ".status.desiredNumberScheduled", "fieldB": ".status.numberAvailable"}})],
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            vec![json!({"condition": {"type": "Established", "status": "True"}})]
        }
        ("batch", "Job") => vec![json!({"condition": {"type": "Complete", "status": "True"}})],
        ("route.openshift.io", "Route") => vec![cel(
            r#"self.status.ingress.all(i, i.conditions.all(c, c.type == "Ready" && c.status == "True"))"#,
            "not all ingress points are reporting ready",
        )],
        ("", "PersistentVolumeClaim") => {
            vec![cel(r#"self.status.phase == "Bound""#, "is not yet Bound")]
        }
        ("operators.coreos.com", "ClusterServiceVersion") => {
            vec![cel(
                r#"self.status.phase == "Succeeded""#,
                "CSV not succeeded",
            )]
        }
        _ => return None,
    };
    Some(json!({"selector": {"kind": {"group": group, "kind": kind}}, "probes": probes}))
}

/// Kinds that are available as soon as they exist: no probe, no warning.
fn needs_no_probe(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        (
            "",
            "Namespace"
                | "ServiceAccount"
                | "Endpoints"
                | "EndpointSlice"
                | "IngressClass"
                | "Service"
                | "Secret"
                | "ConfigMap"
                | "PersistentVolume"
                | "PersistentVolumeClaim"
                | "ResourceQuota"
                | "LimitRange"
        ) | (
            "rbac.authorization.k8s.io",
            "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
        ) | ("scheduling.k8s.io", "PriorityClass")
            | ("networking.k8s.io", "Ingress" | "NetworkPolicy")
            | ("autoscaling", "HorizontalPodAutoscaler")
            | ("policy", "PodDisruptionBudget")
            | ("batch", "CronJob")
            | ("apiregistration.k8s.io", "APIService")
            | (
                "storage.k8s.io",
                "StorageClass" | "CSIDriver" | "CSINode" | "CSIStorageCapacity"
            )
            | (
                "admissionregistration.k8s.io",
                "MutatingWebhookConfiguration"
                    | "ValidatingWebhookConfiguration"
                    | "ValidatingAdmissionPolicy"
            )
    )
}

/// The `-p` values upstream knows; others are ignored.
const PARAMETERS: [&str; 7] = [
    "namespaces",
    "replicas",
    "tolerations",
    "nodeselectors",
    "resources",
    "env",
    "images",
];

/// What `-p` asked for.
#[derive(Debug, Default)]
struct Parameters(BTreeSet<&'static str>);

impl Parameters {
    fn from_flags(flags: &[String]) -> Self {
        let all = flags.iter().any(|f| f == "all");
        Parameters(
            PARAMETERS
                .into_iter()
                .filter(|p| all || flags.iter().any(|f| f == p))
                .collect(),
        )
    }

    fn has(&self, p: &str) -> bool {
        self.0.contains(p)
    }
}

/// A package kickstart would write: files by path, the object count and the kinds lacking probes.
#[derive(Debug)]
pub struct Plan {
    pub files: BTreeMap<String, String>,
    pub object_count: usize,
    pub kinds_without_probes: Vec<String>,
}

/// Config gathered while parametrizing: the schema's properties and the manifest's images.
#[derive(Default)]
struct Config {
    properties: Map<String, Value>,
    images: Vec<(String, String)>,
}

impl Config {
    /// Adds `default` at `config.<section>.<key>`; returns the template expression reading it.
    fn value(&mut self, section: &str, key: &str, default: Value) -> String {
        let (read, schema_type) = self.property(section, key, default);
        match schema_type {
            "array" | "object" => format!("{{{{ toJson {read} }}}}"),
            "string" => format!("{{{{ {read} | quote }}}}"),
            _ => format!("{{{{ {read} }}}}"),
        }
    }

    /// Adds `default` at `config.<section>.<key>`; returns the template term reading it and its type.
    fn property(&mut self, section: &str, key: &str, default: Value) -> (String, &'static str) {
        let schema_type = match &default {
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Bool(_) => "boolean",
            Value::Array(_) => "array",
            _ => "object",
        };
        let mut property = json!({"type": schema_type, "default": default});
        if matches!(schema_type, "array" | "object") {
            property["x-kubernetes-preserve-unknown-fields"] = json!(true);
        }
        let entry = self
            .properties
            .entry(section.to_owned())
            .or_insert_with(|| json!({"type": "object", "default": {}, "properties": {}}));
        entry["properties"][key] = property;
        (format!("(index .config.{section} {key:?})"), schema_type)
    }

    /// Registers a container image; returns the template expression naming it.
    fn image(&mut self, name: &str, image: &str) -> String {
        let name = match self.images.iter().find(|(_, i)| i == image) {
            Some((existing, _)) => existing.clone(),
            None => {
                let mut unique = name.to_owned();
                let mut n = 1;
                while self.images.iter().any(|(existing, _)| *existing == unique) {
                    n += 1;
                    unique = format!("{name}-{n}");
                }
                self.images.push((unique.clone(), image.to_owned()));
                unique
            }
        };
        format!("{{{{ index .images {name:?} | quote }}}}")
    }
}

fn group_kind(object: &Value) -> (String, String) {
    let (group, _, kind) = object_gvk(object);
    (group.to_owned(), kind.to_owned())
}

/// Go's `GroupKind.String()`: `Kind.group`, or `Kind` for the core group.
fn group_kind_text(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// Builds the package from `objects`.
pub fn package_plan(name: &str, objects: Vec<Value>, flags: &[String]) -> Result<Plan, String> {
    let params = Parameters::from_flags(flags);
    let mut config = Config::default();
    let mut files = BTreeMap::new();
    let mut phases_used = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    let mut namespaces_used = BTreeSet::new();
    let mut namespaces_present = BTreeSet::new();
    let object_count = objects.len();
    for mut object in objects {
        let (group, kind) = group_kind(&object);
        let object_name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if kind.is_empty() || object_name.is_empty() {
            return Err(format!(
                "parsing objects: object is missing apiVersion, kind or metadata.name:\n{}",
                serde_saphyr::to_string(&object).unwrap_or_default().trim()
            ));
        }
        let phase = phase_of(&group, &kind);
        object["metadata"]["annotations"][PHASE_ANNOTATION] = json!(phase);
        if group.is_empty() && kind == "Namespace" {
            namespaces_present.insert(object_name.clone());
        }
        if let Some(ns) = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
        {
            if !ns.is_empty() {
                namespaces_used.insert(ns.to_owned());
            }
        }
        phases_used.insert(phase);
        kinds.insert((group.clone(), kind.clone()));
        let (text, templated) = parametrize(&mut object, &group, &kind, &params, &mut config)?;
        let base = format!(
            "{phase}/{}.{}",
            object_name.replace('/', "-"),
            kind.to_lowercase()
        );
        insert_unique(
            &mut files,
            &base,
            if templated { ".yaml.gotmpl" } else { ".yaml" },
            text,
        );
    }
    for ns in namespaces_used.difference(&namespaces_present) {
        phases_used.insert("namespaces");
        let mut object = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "annotations": {PHASE_ANNOTATION: "namespaces"}},
        });
        let (text, templated) = parametrize(&mut object, "", "Namespace", &params, &mut config)?;
        let base = format!("namespaces/{}.namespace", ns.replace('/', "-"));
        insert_unique(
            &mut files,
            &base,
            if templated { ".yaml.gotmpl" } else { ".yaml" },
            text,
        );
    }

    let mut probes = Vec::new();
    let mut kinds_without_probes = Vec::new();
    for (group, kind) in &kinds {
        if needs_no_probe(group, kind) {
            continue;
        }
        match probes_of(group, kind) {
            Some(probe) => probes.push(probe),
            None => kinds_without_probes.push(group_kind_text(group, kind)),
        }
    }
    let phases: Vec<Value> = PHASES
        .iter()
        .filter(|p| phases_used.contains(*p))
        .map(|p| json!({"name": p}))
        .collect();
    let mut spec = json!({
        "scopes": ["Cluster", "Namespaced"],
        "phases": phases,
        "availabilityProbes": probes,
    });
    if !config.images.is_empty() {
        spec["images"] = config
            .images
            .iter()
            .map(|(name, image)| json!({"name": name, "image": image}))
            .collect();
    }
    let mut manifest = json!({
        "apiVersion": format!("{}/{}", pko_proto::MANIFESTS_GROUP, pko_proto::VERSION),
        "kind": "PackageManifest",
        "metadata": {"name": name},
        "spec": spec,
    });
    if !config.properties.is_empty() {
        manifest["spec"]["config"] = json!({"openAPIV3Schema": {
            "type": "object", "properties": config.properties,
        }});
        manifest["test"] = json!({"template": [{"name": "defaults", "context": {}}]});
    }
    files.insert(
        "manifest.yaml".to_owned(),
        serde_saphyr::to_string(&manifest).map_err(|e| e.to_string())?,
    );
    Ok(Plan {
        files,
        object_count,
        kinds_without_probes,
    })
}

/// Adds a file under `base` + `ext`, numbering `base-2`, `base-3`... when two objects share it.
fn insert_unique(files: &mut BTreeMap<String, String>, base: &str, ext: &str, text: String) {
    let mut path = format!("{base}{ext}");
    let mut n = 1;
    while files.contains_key(&path) {
        n += 1;
        path = format!("{base}-{n}{ext}");
    }
    files.insert(path, text);
}

/// The object's YAML, with the fields `params` asks for replaced by template expressions; the bool says
/// whether anything was (the file is then a template).
fn parametrize(
    object: &mut Value,
    group: &str,
    kind: &str,
    params: &Parameters,
    config: &mut Config,
) -> Result<(String, bool), String> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    // (marker, expression)
    let mut expressions: Vec<(String, String)> = Vec::new();
    let mut mark = |slot: &mut Value, expression: String| {
        // Terminated, so that no marker is a prefix of another (`-1-end` vs `-10-end`).
        let marker = format!("pko-kickstart-parameter-{}-end", expressions.len());
        *slot = Value::String(marker.clone());
        expressions.push((marker, expression));
    };
    if params.has("namespaces") {
        let namespace = if group.is_empty() && kind == "Namespace" {
            Some(name.clone())
        } else {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        if let Some(ns) = namespace.filter(|ns| !ns.is_empty()) {
            config
                .properties
                .entry("namespace".to_owned())
                .or_insert_with(|| json!({"type": "string", "default": ""}));
            let (read, _) = config.property("namespaces", &ns, json!(ns));
            // The per-namespace default, unless `.config.namespace` moves everything.
            let expression = format!("{{{{ default {read} .config.namespace | quote }}}}");
            let field = if group.is_empty() && kind == "Namespace" {
                "/metadata/name"
            } else {
                "/metadata/namespace"
            };
            if let Some(slot) = object.pointer_mut(field) {
                mark(slot, expression);
            }
        }
    }
    let workload = matches!(
        (group, kind),
        (
            "apps",
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet"
        ) | ("batch", "Job")
    );
    let cron = group == "batch" && kind == "CronJob";
    if params.has("replicas") && matches!((group, kind), ("apps", "Deployment" | "StatefulSet")) {
        let replicas = object
            .pointer("/spec/replicas")
            .cloned()
            .unwrap_or(json!(1));
        let expression = config.value("replicas", &name, replicas);
        if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
            let slot = spec.entry("replicas").or_insert(Value::Null);
            mark(slot, expression);
        }
    }
    let pod_spec_path = if workload {
        Some("/spec/template/spec")
    } else if cron {
        Some("/spec/jobTemplate/spec/template/spec")
    } else if group.is_empty() && kind == "Pod" {
        Some("/spec")
    } else {
        None
    };
    if let Some(path) = pod_spec_path {
        let key = format!("{}.{name}", kind.to_lowercase());
        if let Some(pod) = object.pointer_mut(path).and_then(Value::as_object_mut) {
            // Only fields the input has: the defaults must reproduce it exactly.
            for (param, field) in [
                ("tolerations", "tolerations"),
                ("nodeselectors", "nodeSelector"),
            ] {
                if !params.has(param) {
                    continue;
                }
                if let Some(slot) = pod.get_mut(field) {
                    let expression = config.value(param, &key, slot.clone());
                    mark(slot, expression);
                }
            }
            for list in ["initContainers", "containers"] {
                let Some(containers) = pod.get_mut(list).and_then(Value::as_array_mut) else {
                    continue;
                };
                for container in containers.iter_mut().filter_map(Value::as_object_mut) {
                    let container_name = container
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let container_key = format!("{key}.{container_name}");
                    for param in ["resources", "env"] {
                        if !params.has(param) {
                            continue;
                        }
                        if let Some(slot) = container.get_mut(param) {
                            let expression = config.value(param, &container_key, slot.clone());
                            mark(slot, expression);
                        }
                    }
                    if params.has("images") {
                        if let Some(image) = container.get("image").and_then(Value::as_str) {
                            let expression = config.image(&container_name, image);
                            mark(container.entry("image").or_insert(Value::Null), expression);
                        }
                    }
                }
            }
        }
    }
    let mut text =
        serde_saphyr::to_string(&*object).map_err(|e| format!("marshalling YAML: {e}"))?;
    if expressions.is_empty() {
        return Ok((text, false));
    }
    // Literal template delimiters in the object must survive rendering.
    text = text.replace("{{", "{{ \"{{\" }}");
    for (marker, expression) in expressions {
        text = text
            .replace(&format!("'{marker}'"), &expression)
            .replace(&format!("\"{marker}\""), &expression)
            .replace(&marker, &expression);
    }
    Ok((text, true))
}

/// Reads every `-f` input: `-` (stdin), an http(s) URL, a file, a directory (its YAML files) or a glob.
pub fn read_inputs(inputs: &[String]) -> Result<Vec<Value>, String> {
    let mut objects = Vec::new();
    for input in inputs {
        let texts = if input == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("get input: reading stdin: {e}"))?;
            vec![text]
        } else if input.starts_with("http://") || input.starts_with("https://") {
            vec![fetch_url(input)?]
        } else {
            let paths: Vec<std::path::PathBuf> = if Path::new(input).exists() {
                vec![input.into()]
            } else {
                let matches: Vec<_> = glob::glob(input)
                    .map_err(|e| {
                        format!("get input: expand pattern: pattern {input:?} is not valid: {e}")
                    })?
                    .filter_map(Result::ok)
                    .collect();
                if matches.is_empty() {
                    return Err(format!(
                        "get input: expand pattern: {input}: file does not exist"
                    ));
                }
                matches
            };
            let mut texts = Vec::new();
            for path in paths {
                read_path(&path, &mut texts)?;
            }
            texts
        };
        for text in texts {
            objects.extend(parse_objects(&text)?);
        }
    }
    Ok(objects)
}

fn read_path(path: &Path, texts: &mut Vec<String>) -> Result<(), String> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| format!("get input: {}: {e}", p.display()))
    };
    if !path.is_dir() {
        texts.push(read(path)?);
        return Ok(());
    }
    let mut entries: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| format!("get input: {}: {e}", path.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            read_path(&entry, texts)?;
        } else if entry
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        {
            texts.push(read(&entry)?);
        }
    }
    Ok(())
}

fn fetch_url(url: &str) -> Result<String, String> {
    crate::build::runtime()?.block_on(async {
        let response = reqwest::get(url)
            .await
            .map_err(|e| format!("get input: HTTP get: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("get input: HTTP get {url}: {}", response.status()));
        }
        response
            .text()
            .await
            .map_err(|e| format!("get input: reading: {e}"))
    })
}

/// The objects of a YAML stream (`List` objects expanded, empty documents skipped).
fn parse_objects(text: &str) -> Result<Vec<Value>, String> {
    let mut objects = Vec::new();
    for document in pko_package::yaml::split_object_file(text) {
        let value: Value =
            serde_saphyr::from_str(document).map_err(|e| format!("parsing objects: {e}"))?;
        match value {
            Value::Null => {}
            Value::Object(map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                objects.extend(
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            object @ Value::Object(_) => objects.push(object),
            other => return Err(format!("parsing objects: not an object: {other}")),
        }
    }
    Ok(objects)
}

/// `kickstart FOLDER`: writes `./FOLDER/` and returns the message upstream prints. With an OLM bundle,
/// its objects join the inputs and its package name names the manifest.
pub fn kickstart(
    folder: &str,
    inputs: &[String],
    olm_bundle: Option<(String, Vec<Value>)>,
    parametrize: &[String],
) -> Result<String, String> {
    let failed = |e: String| format!("kickstarting package: {e}");
    let dir = Path::new(folder);
    if dir.exists() {
        return Err(failed(format!("package folder already exists: {folder}")));
    }
    let mut objects = read_inputs(inputs).map_err(failed)?;
    let name = match olm_bundle {
        Some((package, bundle_objects)) => {
            objects.extend(bundle_objects);
            package
        }
        None => folder.to_owned(),
    };
    let plan = package_plan(&name, objects, parametrize).map_err(failed)?;
    std::fs::create_dir(dir).map_err(|e| failed(format!("create directory: {e}")))?;
    for (path, content) in &plan.files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| failed(format!("creating directory: {e}")))?;
        }
        std::fs::write(&target, content).map_err(|e| failed(format!("writing file: {e}")))?;
    }
    let mut message = format!(
        "Kickstarted the {name:?} package with {} objects.",
        plan.object_count
    );
    if !plan.kinds_without_probes.is_empty() {
        message.push_str("\n[WARN] Some kinds don't have availability probes defined:\n");
        for kind in &plan.kinds_without_probes {
            message.push_str(&format!("- {kind}\n"));
        }
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects(yaml: &str) -> Vec<Value> {
        parse_objects(yaml).unwrap()
    }

    const INPUT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  replicas: 3\n  template:\n    spec:\n      containers:\n      - name: app\n        image: quay.io/shop/web:1\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: web, namespace: shop}\ndata: {motd: \"{{ not a template }}\"}\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n";

    #[test]
    fn objects_go_to_preset_phases_with_probes_and_namespaces() {
        let plan = package_plan("shop", objects(INPUT), &[]).unwrap();
        assert_eq!(
            plan.files.keys().collect::<Vec<_>>(),
            [
                "deploy/web.configmap.yaml",
                "deploy/web.deployment.yaml",
                "manifest.yaml",
                "namespaces/shop.namespace.yaml",
                "other/w.widget.yaml"
            ]
        );
        assert_eq!(plan.object_count, 3);
        assert_eq!(plan.kinds_without_probes, ["Widget.example.com"]);
        let manifest: Value = serde_saphyr::from_str(&plan.files["manifest.yaml"]).unwrap();
        assert_eq!(
            manifest["spec"]["phases"],
            json!([{"name": "namespaces"}, {"name": "deploy"}, {"name": "other"}])
        );
        assert_eq!(
            manifest["spec"]["availabilityProbes"][0]["selector"],
            json!({"kind": {"group": "apps", "kind": "Deployment"}})
        );
        assert!(manifest.get("test").is_none());
    }

    #[test]
    fn parameters_become_config_with_the_input_as_defaults() {
        let flags = vec!["all".to_owned()];
        let plan = package_plan("shop", objects(INPUT), &flags).unwrap();
        let deployment = &plan.files["deploy/web.deployment.yaml.gotmpl"];
        assert!(
            deployment.contains("replicas: {{ (index .config.replicas \"web\") }}"),
            "{deployment}"
        );
        assert!(
            deployment.contains("image: {{ index .images \"app\" | quote }}"),
            "{deployment}"
        );
        let cm = &plan.files["deploy/web.configmap.yaml.gotmpl"];
        assert!(cm.contains("{{ \"{{\" }} not a template }}"), "{cm}");
        let manifest: Value = serde_saphyr::from_str(&plan.files["manifest.yaml"]).unwrap();
        let props = &manifest["spec"]["config"]["openAPIV3Schema"]["properties"];
        assert_eq!(props["replicas"]["properties"]["web"]["default"], 3);
        assert_eq!(props["namespaces"]["properties"]["shop"]["default"], "shop");
        assert_eq!(
            manifest["spec"]["images"],
            json!([{"name": "app", "image": "quay.io/shop/web:1"}])
        );
        assert_eq!(manifest["test"]["template"][0]["name"], "defaults");
        // Unknown values are ignored.
        let plain = package_plan("shop", objects(INPUT), &["bogus".to_owned()]).unwrap();
        assert!(plain.files.keys().all(|k| !k.ends_with(".gotmpl")));
    }

    #[test]
    fn many_parameters_in_one_object_keep_their_own_expressions() {
        let containers: Vec<String> = (0..6)
            .map(|i| {
                format!(
                    "      - {{name: c{i}, image: img{i}, env: [{{name: E, value: \"{i}\"}}]}}\n"
                )
            })
            .collect();
        let deployment = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d, namespace: n}}\nspec:\n  replicas: 2\n  template:\n    spec:\n      containers:\n{}",
            containers.concat()
        );
        let plan = package_plan("p", objects(&deployment), &["all".to_owned()]).unwrap();
        let text = &plan.files["deploy/d.deployment.yaml.gotmpl"];
        assert!(!text.contains("pko-kickstart-parameter"), "{text}");
        for i in 0..6 {
            assert!(text.contains(&format!("index .images \"c{i}\"")), "{text}");
            assert!(
                text.contains(&format!("index .config.env \"deployment.d.c{i}\"")),
                "{text}"
            );
        }
    }

    #[test]
    fn objects_sharing_a_file_name_are_numbered() {
        let two = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: x}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: y}\n";
        let plan = package_plan("p", objects(two), &[]).unwrap();
        assert!(plan.files.contains_key("deploy/a.configmap.yaml"));
        assert!(plan.files.contains_key("deploy/a.configmap-2.yaml"));
        assert!(package_plan("p", objects("kind: ConfigMap\n"), &[]).is_err());
    }
}
