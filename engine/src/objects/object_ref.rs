//! Identity of a Kubernetes object independent of its content: group, version, kind, namespace, name.

use std::fmt;

use serde_json::Value;

/// Identifies one object; `namespace` is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    /// Reads the key of a JSON object; `None` when apiVersion, kind or name is missing.
    pub fn of(object: &Value) -> Option<Self> {
        let api_version = object.get("apiVersion")?.as_str()?;
        let kind = object.get("kind")?.as_str()?;
        let name = object.pointer("/metadata/name")?.as_str()?;
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let (group, version) = split_api_version(api_version);
        if kind.is_empty() || name.is_empty() || version.is_empty() {
            return None;
        }
        Some(Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// `group/version`, or just `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The same object regardless of API version (used to find duplicates).
    pub fn without_version(&self) -> (String, String, String, String) {
        (
            self.group.clone(),
            self.kind.clone(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }
}

/// Splits `apps/v1` into (`apps`, `v1`) and `v1` into (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

impl fmt::Display for ObjectKey {
    /// PKO's form in messages: `<group> <Kind> <namespace>/<name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        if self.namespace.is_empty() {
            write!(f, "{group} {} {}", self.kind, self.name)
        } else {
            write!(f, "{group} {} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}
