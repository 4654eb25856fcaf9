//! `build` and `update`, the commands that talk to registries: `build` validates a folder (with lookups
//! of the locked digests and the template tests), then writes a tarball and/or pushes to every tag;
//! `update` resolves the digests of the manifest's images into `manifest.lock.yaml`.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use oci_client::Reference;
use pko_package::image::ImageStore;
use pko_package::manifest::{load_lock, parse_manifest};
use pko_package::oci_layout::write_layout;
use serde_json::Value;

use crate::args::BuildArgs;
use crate::registry_auth::auth_for;
use crate::validation::{import, structure, validate_units};

pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("async runtime: {e}"))
}

/// A store speaking plain HTTP to `plain_http` and, with `insecure`, to the registries of `images`.
pub fn store(insecure: bool, images: &[String], plain_http: &[String]) -> ImageStore {
    let mut hosts = plain_http.to_vec();
    if insecure {
        hosts.extend(
            images
                .iter()
                .filter_map(|i| i.parse::<Reference>().ok())
                .map(|r| r.registry().to_owned()),
        );
    }
    ImageStore::new(hosts)
}

/// `PKO_REPOSITORY_HOST` points every image at another registry host (a mirror), keeping the path.
fn with_repository_host(image: &str) -> String {
    let Ok(host) = std::env::var("PKO_REPOSITORY_HOST") else {
        return image.to_owned();
    };
    if host.is_empty() {
        return image.to_owned();
    }
    match image.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            format!("{host}/{rest}")
        }
        _ => format!("{host}/{image}"),
    }
}

/// pflag's string-to-string parsing of the `--label` values: `k=v` taken whole, several `=` split as CSV.
fn parse_labels(values: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for value in values {
        let items: Vec<String> = if value.matches('=').count() == 1 {
            vec![value.trim_matches('"').to_owned()]
        } else {
            value.split(',').map(str::to_owned).collect()
        };
        for item in items {
            let Some((k, v)) = item.split_once('=') else {
                return Err(format!(
                    "invalid argument {value:?} for \"-l, --label\" flag: {item} must be formatted as key=value"
                ));
            };
            labels.insert(k.to_owned(), v.to_owned());
        }
    }
    Ok(labels)
}

/// `build SOURCE`: stdout on success, the error message otherwise.
pub fn build(source: &str, args: &BuildArgs) -> Result<String, String> {
    if source.is_empty() {
        return Err("arguments invalid: source path empty".to_owned());
    }
    if (!args.output.is_empty() || args.push) && args.tags.is_empty() {
        return Err(
            "arguments invalid: output or push is requested but no tags are set".to_owned(),
        );
    }
    // Tags as given go into the tarball (docker completes them on load); pushes use the full reference.
    let tags = args.tags.clone();
    let mut push_refs = Vec::new();
    for tag in &tags {
        let reference: Reference = tag
            .parse()
            .map_err(|e| format!("invalid tag specified as parameter {tag}: {e}"))?;
        push_refs.push(reference.whole());
    }
    let labels = parse_labels(&args.labels)?;
    if let Some((key, _)) = labels.iter().find(|(_, v)| v.is_empty()) {
        return Err(format!("parsing label {key:?}, value is empty"));
    }
    let digest_output = match args.output_format.as_str() {
        "" | "human" => false,
        "digest" => true,
        other => return Err(format!("unknown output format: {other}")),
    };

    let dir = Path::new(source);
    let files = import(dir)
        .map_err(|e| format!("building from source: load source from disk path {source}: {e}"))?;
    let loading = |e: String| format!("building from source: loading package from files: {e}");
    let units = structure(dir, &files).map_err(|e| loading(e.to_string()))?;

    // Every locked digest must exist on its registry.
    let lock_images: Vec<(String, String, String)> = load_lock(&files)
        .ok()
        .flatten()
        .map(|(_, lock)| {
            lock.spec
                .images
                .iter()
                .map(|i| (i.name.clone(), i.image.clone(), i.digest.clone()))
                .collect()
        })
        .unwrap_or_default();
    let lookups: Vec<String> = lock_images
        .iter()
        .map(|(_, image, digest)| {
            let image = with_repository_host(image);
            let repository = pko_package::image_lock::repository(&image);
            format!("{repository}@{digest}")
        })
        .collect();
    let mut all_refs = push_refs.clone();
    all_refs.extend(lookups.iter().cloned());
    let store = store(args.insecure, &all_refs, &args.plain_http);
    let runtime = runtime()?;
    let mut findings = Vec::new();
    for ((name, _, digest), lookup) in lock_images.iter().zip(&lookups) {
        if let Err(e) = runtime.block_on(store.resolve_digest(lookup, &auth_for(lookup))) {
            findings.push(format!("{e}: image {name:?} digest error ({digest:?})"));
        }
    }
    findings.extend(validate_units(&units, true).map_err(&loading)?);
    if !findings.is_empty() {
        return Err(loading(findings.join("\n")));
    }

    if !args.output.is_empty() {
        let output = Path::new(&args.output);
        if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("building from source: exporting package to image: {e}"))?;
        }
        let tar = write_layout(&files, &tags, &labels)
            .map_err(|e| format!("building from source: exporting package to image: {e}"))?;
        std::fs::write(output, tar).map_err(|e| {
            format!(
                "building from source: exporting package to image: {}: {e}",
                output.display()
            )
        })?;
    }
    let mut digest = None;
    if args.push {
        for tag in &push_refs {
            runtime
                .block_on(store.push_labelled(tag, &files, &labels, &auth_for(tag)))
                .map_err(|e| {
                    format!("building from source: exporting package to image: push: {e}")
                })?;
        }
        if let Some(first) = push_refs.first() {
            digest = Some(
                runtime
                    .block_on(store.resolve_digest(first, &auth_for(first)))
                    .map_err(|e| {
                        format!("building from source: exporting package to image: push: {e}")
                    })?,
            );
        }
    }
    Ok(match (digest_output, digest) {
        (true, Some(digest)) => format!("{digest}\n"),
        (true, None) => String::new(),
        (false, _) => "Package built successfully!".to_owned(),
    })
}

/// `update DIR`: stdout on success, the error message otherwise.
pub fn update(target: &str, insecure: bool, plain_http: &[String]) -> Result<String, String> {
    if target.is_empty() {
        return Err("arguments invalid: target path empty".to_owned());
    }
    let dir = Path::new(target);
    let failed = |e: String| format!("generating lock data: {e}");
    let files = import(dir).map_err(|e| failed(format!("loading package: {e}")))?;
    let (_, manifest) =
        parse_manifest(&files).map_err(|e| failed(format!("loading package: {e}")))?;
    // Dependencies resolve through package repositories, which pko's manager does not install yet;
    // locking only the images would write a lock upstream would call incomplete.
    if manifest
        .spec
        .other
        .get("dependencies")
        .and_then(Value::as_array)
        .is_some_and(|d| !d.is_empty())
    {
        return Err(failed(
            "spec.dependencies: locking package dependencies is not supported by pko yet"
                .to_owned(),
        ));
    }
    let images: Vec<String> = manifest
        .spec
        .images
        .iter()
        .map(|i| with_repository_host(&i.image))
        .collect();
    let store = store(insecure, &images, plain_http);
    let runtime = runtime()?;
    let mut locked = Vec::new();
    for (image, lookup) in manifest.spec.images.iter().zip(&images) {
        let digest = runtime
            .block_on(store.resolve_digest(lookup, &auth_for(lookup)))
            .map_err(|e| {
                failed(format!(
                    "resolving lock image for {:?}: resolving image digest: {e}",
                    image.image
                ))
            })?;
        locked.push((image.name.clone(), image.image.clone(), digest));
    }
    let current: Option<Vec<(String, String, String)>> =
        load_lock(&files).ok().flatten().map(|(_, lock)| {
            lock.spec
                .images
                .into_iter()
                .map(|i| (i.name, i.image, i.digest))
                .collect()
        });
    if current.as_ref() == Some(&locked) {
        return Ok("Package is already up-to-date\n".to_owned());
    }
    let path = dir.join("manifest.lock.yaml");
    std::fs::write(&path, lock_yaml(&locked, Timestamp::now()))
        .map_err(|e| failed(format!("writing lock file: {e}")))?;
    Ok("Package updated successfully!\n".to_owned())
}

/// The lock file as upstream writes it: keys sorted, list items at their key's indent, the creation time
/// in whole seconds.
pub fn lock_yaml(images: &[(String, String, String)], now: Timestamp) -> String {
    let created = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut out = format!(
        "apiVersion: {}/{}\nkind: PackageManifestLock\nmetadata:\n  creationTimestamp: \"{created}\"\nspec:\n",
        pko_proto::MANIFESTS_GROUP,
        pko_proto::VERSION
    );
    if images.is_empty() {
        out.push_str("  images: []\n");
    } else {
        out.push_str("  images:\n");
        for (name, image, digest) in images {
            out.push_str(&format!(
                "  - digest: {}\n    image: {}\n    name: {}\n",
                scalar(digest),
                scalar(image),
                scalar(name)
            ));
        }
    }
    out
}

/// A string as YAML writes it: plain unless YAML would read it as something else.
fn scalar(s: &str) -> String {
    let plain_reads_back = serde_saphyr::from_str::<Value>(s)
        .ok()
        .is_some_and(|v| v == Value::String(s.to_owned()));
    let risky = s.is_empty()
        || s.contains(": ")
        || s.contains(" #")
        || s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@`".contains(c) || c.is_whitespace())
        || s.ends_with(char::is_whitespace);
    if plain_reads_back && !risky {
        s.to_owned()
    } else {
        Value::String(s.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_files_are_written_like_upstream() {
        let now: Timestamp = "2024-08-16T07:59:23.5Z".parse().unwrap();
        let images = vec![
            (
                "nginx1".to_owned(),
                "nginx:1.22.1".to_owned(),
                "sha256:ab12".to_owned(),
            ),
            ("odd".to_owned(), "x/y:1".to_owned(), "1234".to_owned()),
        ];
        assert_eq!(
            lock_yaml(&images, now),
            "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifestLock\nmetadata:\n  creationTimestamp: \"2024-08-16T07:59:23Z\"\nspec:\n  images:\n  - digest: sha256:ab12\n    image: nginx:1.22.1\n    name: nginx1\n  - digest: \"1234\"\n    image: x/y:1\n    name: odd\n"
        );
        assert!(lock_yaml(&[], now).ends_with("spec:\n  images: []\n"));
    }

    #[test]
    fn labels_parse_as_pflag_string_to_string() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse_labels(&v(&["k=a,b", "x=1,y=2", "k=c"])).unwrap(),
            BTreeMap::from([
                ("k".to_owned(), "c".to_owned()),
                ("x".to_owned(), "1".to_owned()),
                ("y".to_owned(), "2".to_owned()),
            ])
        );
        assert_eq!(
            parse_labels(&v(&["novalue"])).unwrap_err(),
            "invalid argument \"novalue\" for \"-l, --label\" flag: novalue must be formatted as key=value"
        );
    }
}
