//! `repository` (`repo`): a package repository index in a file, as upstream keeps it: a YAML stream of a
//! `Repository` document followed by one `RepositoryEntry` per package image (image without tag, digest,
//! the versions it is published as, newest first, the package name and its constraints). The index is
//! shipped as an image holding `repository/repository.yaml`. Nothing is printed on success.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use oci_client::Reference;
use pko_package::files::PackageFiles;
use pko_package::image_lock::repository as image_repository;
use pko_package::manifest::parse_manifest;
use serde_json::{json, Value};

use crate::build::{runtime, store};
use crate::registry_auth::auth_for;

const INDEX_PREFIX: &str = "repository/";
const INDEX_FILE: &str = "repository.yaml";

/// One package image of the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub image: String,
    pub digest: String,
    pub versions: Vec<semver::Version>,
    pub name: String,
    pub constraints: Option<Value>,
}

/// The index: its name and creation time, and its entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    pub name: String,
    pub created: String,
    pub entries: Vec<Entry>,
}

impl Index {
    pub fn new(name: &str, now: Timestamp) -> Self {
        Index {
            name: name.to_owned(),
            created: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            entries: Vec::new(),
        }
    }

    /// The index as a YAML stream, each document starting with `---`.
    pub fn to_yaml(&self) -> Result<String, String> {
        let group_version = format!("{}/{}", pko_proto::MANIFESTS_GROUP, pko_proto::VERSION);
        let mut documents = vec![json!({
            "apiVersion": group_version, "kind": "Repository",
            "metadata": {"name": self.name, "creationTimestamp": self.created},
        })];
        for entry in &self.entries {
            let mut data = json!({
                "image": entry.image,
                "digest": entry.digest,
                "versions": entry.versions.iter().map(|v| format!("v{v}")).collect::<Vec<_>>(),
                "name": entry.name,
            });
            if let Some(constraints) = &entry.constraints {
                data["constraints"] = constraints.clone();
            }
            documents.push(json!({
                "apiVersion": group_version, "kind": "RepositoryEntry",
                "metadata": {"name": format!("{}.{}", entry.name, entry.digest)},
                "data": data,
            }));
        }
        let mut out = String::new();
        for document in documents {
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&document).map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let mut documents = pko_package::yaml::split_object_file(text)
            .into_iter()
            .filter(|d| !d.is_empty())
            .map(|d| serde_saphyr::from_str::<Value>(d).map_err(|e| e.to_string()));
        let head = documents.next().ok_or("empty repository file")??;
        if head["kind"] != "Repository" {
            return Err(format!(
                "first document is a {}, not a Repository",
                head["kind"]
            ));
        }
        let field = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let mut index = Index {
            name: field(&head, "/metadata/name"),
            created: field(&head, "/metadata/creationTimestamp"),
            entries: Vec::new(),
        };
        for document in documents {
            let document = document?;
            let versions = document
                .pointer("/data/versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|v| {
                    semver::Version::parse(v.trim_start_matches('v'))
                        .map_err(|e| format!("version {v:?}: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            index.entries.push(Entry {
                image: field(&document, "/data/image"),
                digest: field(&document, "/data/digest"),
                versions,
                name: field(&document, "/data/name"),
                constraints: document.pointer("/data/constraints").cloned(),
            });
        }
        Ok(index)
    }

    /// Adds `versions` of the package image; a version the package already has is an error.
    pub fn add(&mut self, mut entry: Entry) -> Result<(), String> {
        for existing in self.entries.iter().filter(|e| e.name == entry.name) {
            if let Some(v) = entry
                .versions
                .iter()
                .find(|v| existing.versions.contains(v))
            {
                return Err(format!(
                    "package {:?} version \"v{v}\" already exists",
                    entry.name
                ));
            }
        }
        match self
            .entries
            .iter_mut()
            .find(|e| e.image == entry.image && e.digest == entry.digest)
        {
            Some(existing) => existing.versions.append(&mut entry.versions),
            None => self.entries.push(entry),
        }
        for e in &mut self.entries {
            e.versions.sort_by(|a, b| b.cmp(a));
        }
        Ok(())
    }

    /// Removes the entry of the image with `digest` from `image`'s repository.
    pub fn remove(&mut self, image: &str, digest: &str) -> Result<(), String> {
        let before = self.entries.len();
        self.entries
            .retain(|e| !(e.image == image && e.digest == digest));
        if self.entries.len() == before {
            return Err(format!("no entry for {image}@sha256:{digest}"));
        }
        Ok(())
    }
}

/// A reference with registry and tag or digest spelled out (upstream parses strictly here).
fn strict_reference(reference: &str) -> Result<Reference, String> {
    let first = reference.split('/').next().unwrap_or_default();
    let has_registry = reference.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    let last = reference.rsplit('/').next().unwrap_or_default();
    let has_tag = last.contains(':') || reference.contains('@');
    if !has_registry || !has_tag {
        return Err(format!("could not parse reference: {reference}"));
    }
    reference
        .parse()
        .map_err(|_| format!("could not parse reference: {reference}"))
}

fn read_index(file: &str) -> Result<Index, String> {
    let text = std::fs::read_to_string(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("open {file}: no such file or directory"),
        _ => format!("open {file}: {e}"),
    })?;
    Index::from_yaml(&text)
}

fn write_index(file: &str, index: &Index) -> Result<(), String> {
    let text = index.to_yaml()?;
    write_private(file, &text)
}

/// Writes with mode 0600 (truncating), as upstream does.
fn write_private(file: &str, text: &str) -> Result<(), String> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut f = options
        .open(file)
        .map_err(|e| format!("open {file}: {e}"))?;
    f.write_all(text.as_bytes())
        .map_err(|e| format!("write {file}: {e}"))
}

pub fn init(file: &str, name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("arguments invalid: name must be not empty".to_owned());
    }
    if file.is_empty() {
        return Err("arguments invalid: file must be not empty".to_owned());
    }
    write_index(file, &Index::new(name, Timestamp::now()))?;
    Ok(String::new())
}

/// The digest (hex) and files of a package image.
fn pull_package(
    reference: &Reference,
    plain_http: &[String],
) -> Result<(String, PackageFiles), String> {
    let store = store(false, &[], plain_http);
    let (digest, files) = runtime()?
        .block_on(store.fetch(&reference.whole(), &auth_for(&reference.whole())))
        .map_err(|e| e.to_string())?;
    Ok((
        digest.trim_start_matches("sha256:").to_owned(),
        (*files).clone(),
    ))
}

pub fn add(
    file: &str,
    reference: &str,
    versions: &[String],
    plain_http: &[String],
) -> Result<String, String> {
    let reference = strict_reference(reference).map_err(|e| format!("package reference: {e}"))?;
    let versions = versions
        .iter()
        .map(|v| {
            semver::Version::parse(v.trim_start_matches('v')).map_err(|e| format!("version: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut index = read_index(file)?;
    let (digest, files) =
        pull_package(&reference, plain_http).map_err(|e| format!("pull package image: {e}"))?;
    let (_, manifest) =
        parse_manifest(&files).map_err(|e| format!("raw package from package image: {e}"))?;
    index
        .add(Entry {
            image: image_repository(&reference.whole()).to_owned(),
            digest,
            versions,
            name: manifest.metadata.name.clone().unwrap_or_default(),
            constraints: manifest.spec.other.get("constraints").cloned(),
        })
        .map_err(|e| format!("add new entry: {e}"))?;
    write_index(file, &index)?;
    Ok(String::new())
}

pub fn remove(file: &str, reference: &str, plain_http: &[String]) -> Result<String, String> {
    let reference =
        strict_reference(reference).map_err(|e| format!("given package reference: {e}"))?;
    let mut index = read_index(file).map_err(|e| format!("read from file: {e}"))?;
    // Upstream wraps these as "add new entry" too.
    let (digest, _) =
        pull_package(&reference, plain_http).map_err(|e| format!("add new entry: {e}"))?;
    index
        .remove(image_repository(&reference.whole()), &digest)
        .map_err(|e| format!("add new entry: {e}"))?;
    write_index(file, &index)?;
    Ok(String::new())
}

pub fn pull(file: &str, tag: &str, plain_http: &[String]) -> Result<String, String> {
    let failed = |e: String| format!("pull repository image: {e}");
    let reference: Reference = tag.parse().map_err(|e| failed(format!("{e}")))?;
    let store = store(false, &[], plain_http);
    let files = runtime()?
        .block_on(store.fetch_under(&reference.whole(), INDEX_PREFIX, &auth_for(tag)))
        .map_err(|e| failed(e.to_string()))?;
    let text = files
        .get(INDEX_FILE)
        .ok_or_else(|| failed(format!("image holds no {INDEX_PREFIX}{INDEX_FILE}")))?;
    write_private(file, &String::from_utf8_lossy(text))?;
    Ok(String::new())
}

pub fn push(file: &str, tag: &str, plain_http: &[String]) -> Result<String, String> {
    let text = std::fs::read(file).map_err(|e| format!("read from file: open {file}: {e}"))?;
    let index_text = String::from_utf8_lossy(&text);
    Index::from_yaml(&index_text).map_err(|e| format!("read from file: {e}"))?;
    // Upstream wraps push failures as "pull repository image" (sic).
    let failed = |e: String| format!("pull repository image: {e}");
    let reference: Reference = tag.parse().map_err(|e| failed(format!("{e}")))?;
    let files: PackageFiles = [(INDEX_FILE.to_owned(), text)].into();
    runtime()?
        .block_on(store(false, &[], plain_http).push_under(
            &reference.whole(),
            &files,
            INDEX_PREFIX,
            &BTreeMap::new(),
            &auth_for(tag),
        ))
        .map_err(|e| failed(e.to_string()))?;
    Ok(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, digest: &str, versions: &[&str]) -> Entry {
        Entry {
            image: "quay.io/p/pkg".to_owned(),
            digest: digest.to_owned(),
            versions: versions
                .iter()
                .map(|v| semver::Version::parse(v).unwrap())
                .collect(),
            name: name.to_owned(),
            constraints: None,
        }
    }

    #[test]
    fn entries_keep_versions_newest_first_and_refuse_duplicates() {
        let now: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let mut index = Index::new("repo", now);
        index.add(entry("pkg", "aa", &["1.0.0"])).unwrap();
        index.add(entry("pkg", "aa", &["1.2.0"])).unwrap();
        index.add(entry("pkg", "bb", &["2.0.0"])).unwrap();
        assert_eq!(
            index.add(entry("pkg", "cc", &["1.2.0"])).unwrap_err(),
            "package \"pkg\" version \"v1.2.0\" already exists"
        );
        let yaml = index.to_yaml().unwrap();
        assert!(yaml.starts_with("---\napiVersion: manifests.package-operator.run/v1alpha1\nkind: Repository\nmetadata:\n  creationTimestamp: \"2026-01-02T03:04:05Z\"\n  name: repo\n---\n"), "{yaml}");
        assert!(
            yaml.contains("versions:\n  - v1.2.0\n  - v1.0.0\n"),
            "{yaml}"
        );
        let read = Index::from_yaml(&yaml).unwrap();
        assert_eq!(read, index);
        index.remove("quay.io/p/pkg", "aa").unwrap();
        assert_eq!(index.entries.len(), 1);
        assert!(index.remove("quay.io/p/pkg", "aa").is_err());
    }

    #[test]
    fn references_must_name_registry_and_tag() {
        assert!(strict_reference("quay.io/p/pkg:v1").is_ok());
        assert!(strict_reference("127.0.0.1:5000/p/pkg@sha256:0000000000000000000000000000000000000000000000000000000000000000").is_ok());
        assert_eq!(
            strict_reference("pkg:v1").unwrap_err(),
            "could not parse reference: pkg:v1"
        );
        assert!(strict_reference("quay.io/p/pkg").is_err());
    }
}
