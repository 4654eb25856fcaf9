//! Package images as tar files, the offline form of a package image: `kubectl-package build --output`
//! writes one, `validate`/`tree` read one. The tar is an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/...`, for `skopeo copy oci-archive:...`) and carries a docker-save `manifest.json` naming
//! the same blobs with the tags as RepoTags, so `docker load`/`podman load`/`kind load image-archive`
//! take it as they take upstream's output.
//!
//! Pure bytes in and out; the layer format is `image.rs`'s.

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::canonical_hash::hex;
use super::files::PackageFiles;
use super::image::{append_file, image_config, pack, unpack, ImageError};

const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    format!("sha256:{}", hex(&hash))
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": digest(bytes), "size": bytes.len()})
}

fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

/// A tar holding `files` as a one-layer package image tagged with every one of `tags`, its config
/// carrying `labels`.
pub fn write_layout(
    files: &PackageFiles,
    tags: &[String],
    labels: &BTreeMap<String, String>,
) -> Result<Vec<u8>, ImageError> {
    let pack_err = |e: std::io::Error| ImageError::Pack(e.to_string());
    let layer = pack(files)?;
    let config = image_config(labels);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor(CONFIG_MEDIA_TYPE, &config),
        "layers": [descriptor(LAYER_MEDIA_TYPE, &layer)],
    }))
    .map_err(|e| ImageError::Pack(e.to_string()))?;
    let manifests: Vec<Value> = tags
        .iter()
        .map(|tag| {
            let mut d = descriptor(MANIFEST_MEDIA_TYPE, &manifest);
            d["annotations"] = json!({ REF_NAME_ANNOTATION: tag });
            d
        })
        .collect();
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests}))
        .map_err(|e| ImageError::Pack(e.to_string()))?;
    let docker_manifest = serde_json::to_vec(&json!([{
        "Config": blob_path(&digest(&config)),
        "RepoTags": tags,
        "Layers": [blob_path(&digest(&layer))],
    }]))
    .map_err(|e| ImageError::Pack(e.to_string()))?;

    let entries: Vec<(String, &[u8])> = vec![
        (
            "oci-layout".to_owned(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
        ),
        ("index.json".to_owned(), &index),
        ("manifest.json".to_owned(), &docker_manifest),
        (blob_path(&digest(&manifest)), &manifest),
        (blob_path(&digest(&config)), &config),
        (blob_path(&digest(&layer)), &layer),
    ];
    let mut archive = tar::Builder::new(Vec::new());
    for (path, content) in entries {
        append_file(&mut archive, &path, content).map_err(pack_err)?;
    }
    archive.into_inner().map_err(pack_err)
}

/// The package files of the (first) image in an OCI layout tar; `name` names the file in errors.
pub fn read_layout(name: &str, tar_bytes: &[u8]) -> Result<PackageFiles, ImageError> {
    let err = |message: String| ImageError::Layer {
        reference: name.to_owned(),
        index: 0,
        message,
    };
    let mut entries: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().map_err(|e| err(e.to_string()))? {
        let mut entry = entry.map_err(|e| err(e.to_string()))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(|e| err(e.to_string()))?;
        let path = path.to_string_lossy().trim_start_matches("./").to_owned();
        let mut content = Vec::new();
        entry
            .read_to_end(&mut content)
            .map_err(|e| err(e.to_string()))?;
        entries.insert(path, content);
    }
    let json = |path: &str| -> Result<Value, ImageError> {
        let bytes = entries
            .get(path)
            .ok_or_else(|| err(format!("not an OCI layout: {path} missing")))?;
        serde_json::from_slice(bytes).map_err(|e| err(format!("{path}: {e}")))
    };
    let index = json("index.json")?;
    let manifest_digest = index
        .pointer("/manifests/0/digest")
        .and_then(Value::as_str)
        .ok_or_else(|| err("index.json lists no manifest".to_owned()))?;
    let manifest = json(&blob_path(manifest_digest))?;
    let mut layers = Vec::new();
    for (i, layer) in manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let media_type = layer["mediaType"].as_str().unwrap_or_default();
        let layer_digest = layer["digest"].as_str().unwrap_or_default();
        let blob = entries
            .get(&blob_path(layer_digest))
            .ok_or_else(|| err(format!("layer {i}: blob {layer_digest} missing")))?;
        if digest(blob) != layer_digest {
            return Err(err(format!(
                "layer {i}: content does not match {layer_digest}"
            )));
        }
        layers.push((media_type, blob.as_slice()));
    }
    unpack(name, &layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> PackageFiles {
        [
            ("manifest.yaml", "kind: PackageManifest"),
            ("deploy/cm.yaml", "kind: ConfigMap"),
        ]
        .iter()
        .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
        .collect()
    }

    #[test]
    fn layouts_round_trip_and_are_reproducible() {
        let tags = ["pkg:v1".to_owned(), "pkg:latest".to_owned()];
        let labels = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        let tar = write_layout(&files(), &tags, &labels).unwrap();
        assert_eq!(read_layout("pkg.tar", &tar).unwrap(), files());
        assert_eq!(write_layout(&files(), &tags, &labels).unwrap(), tar);
        // docker load's view of the same tar: tags and the blobs they name.
        let mut archive = tar::Archive::new(tar.as_slice());
        let docker: Value = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.path().unwrap().to_str() == Some("manifest.json"))
            .map(|e| serde_json::from_reader(e).unwrap())
            .unwrap();
        assert_eq!(docker[0]["RepoTags"], json!(tags));
        assert!(docker[0]["Config"]
            .as_str()
            .unwrap()
            .starts_with("blobs/sha256/"));
    }

    #[test]
    fn broken_layouts_are_errors() {
        let err = read_layout("x.tar", &write_tar(&[("oci-layout", b"{}")])).unwrap_err();
        assert!(err.to_string().contains("index.json missing"), "{err}");
        let err = read_layout("x.tar", b"not a tar at all").unwrap_err();
        assert!(err.to_string().contains("x.tar"), "{err}");
    }

    fn write_tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut archive = tar::Builder::new(Vec::new());
        for (path, content) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            archive.append_data(&mut header, path, *content).unwrap();
        }
        archive.into_inner().unwrap()
    }
}
