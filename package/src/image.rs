//! Package images: an OCI image whose layers are tar archives holding the package under `package/`. Pull
//! (anonymous or with credentials), unpack (later layers override earlier ones, dot-paths ignored), cache
//! by manifest digest so an image is downloaded once, and build/push from a package directory.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tracing::instrument;

use super::files::{is_hidden, PackageFiles};

/// The directory inside image layers that holds the package.
pub const PACKAGE_PREFIX: &str = "package/";

/// Why an image could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image reference {reference:?}: {message}")]
    Reference { reference: String, message: String },
    #[error("image {reference} not found")]
    NotFound { reference: String },
    #[error("image {reference}: access denied: {message}")]
    Unauthorized { reference: String, message: String },
    #[error("image {reference}: {message}")]
    Registry { reference: String, message: String },
    #[error("image {reference}: layer {index}: {message}")]
    Layer {
        reference: String,
        index: usize,
        message: String,
    },
    #[error("image {reference}: no files under {prefix:?}")]
    Empty { reference: String, prefix: String },
    #[error("packing the package: {0}")]
    Pack(String),
}

/// Pulls, caches and pushes package images; cheap to share.
pub struct ImageStore {
    protocol: ClientProtocol,
    by_digest: DashMap<String, Arc<PackageFiles>>,
    /// One registry client per set of credentials (see [`ImageStore::client`]).
    clients: DashMap<String, Client>,
    pulls: AtomicU64,
}

impl ImageStore {
    /// `insecure_registries` are reached over plain HTTP (local registries).
    pub fn new(insecure_registries: Vec<String>) -> Self {
        let protocol = if insecure_registries.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(insecure_registries)
        };
        Self {
            protocol,
            by_digest: DashMap::new(),
            clients: DashMap::new(),
            pulls: AtomicU64::new(0),
        }
    }

    /// The registry client for `auth`. oci-client remembers the first credentials it sees per registry
    /// and ignores later ones, so one client for all would keep pulling with stale (or anonymous)
    /// credentials after a pull secret is added or rotated; a client per operation instead costs a TLS
    /// setup with the system's root certificates each time (at 500 Packages, most of the manager's CPU
    /// and hundreds of MiB of memory). So clients are shared per credentials: a rotated secret gets a
    /// new client, and the few stale ones left behind are small.
    fn client(&self, auth: &RegistryAuth) -> Client {
        let key = match auth {
            RegistryAuth::Anonymous => "anonymous".to_owned(),
            RegistryAuth::Basic(user, password) => format!("basic\0{user}\0{password}"),
            RegistryAuth::Bearer(token) => format!("bearer\0{token}"),
        };
        self.clients
            .entry(key)
            .or_insert_with(|| {
                Client::new(ClientConfig {
                    protocol: self.protocol.clone(),
                    ..ClientConfig::default()
                })
            })
            .clone()
    }

    /// How many images were actually downloaded (cache misses).
    pub fn pulls(&self) -> u64 {
        self.pulls.load(Ordering::Relaxed)
    }

    /// The package files of `image` and the image's manifest digest. Resolves the digest first and
    /// downloads layers only for a digest not seen before.
    #[instrument(skip(self, auth))]
    pub async fn fetch(
        &self,
        image: &str,
        auth: &RegistryAuth,
    ) -> Result<(String, Arc<PackageFiles>), ImageError> {
        let reference = parse_reference(image)?;
        let client = self.client(auth);
        let digest = client
            .fetch_manifest_digest(&reference, auth)
            .await
            .map_err(|e| registry_error(image, e))?;
        if let Some(files) = self.by_digest.get(&digest) {
            return Ok((digest, files.clone()));
        }
        let files = Arc::new(
            self.pull_files(image, &reference, PACKAGE_PREFIX, auth)
                .await?,
        );
        self.pulls.fetch_add(1, Ordering::Relaxed);
        self.by_digest.insert(digest.clone(), files.clone());
        Ok((digest, files))
    }

    /// The files under `prefix` (`""`: all) of `image`, uncached: for images that are not packages (OLM
    /// bundles, repository indexes).
    #[instrument(skip(self, auth))]
    pub async fn fetch_under(
        &self,
        image: &str,
        prefix: &str,
        auth: &RegistryAuth,
    ) -> Result<PackageFiles, ImageError> {
        let reference = parse_reference(image)?;
        self.pull_files(image, &reference, prefix, auth).await
    }

    /// Downloads the layers of `reference` and unpacks the files under `prefix`.
    async fn pull_files(
        &self,
        image: &str,
        reference: &Reference,
        prefix: &str,
        auth: &RegistryAuth,
    ) -> Result<PackageFiles, ImageError> {
        let data = self
            .client(auth)
            .pull(
                reference,
                auth,
                vec![IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE],
            )
            .await
            .map_err(|e| registry_error(image, e))?;
        let layers: Vec<(&str, &[u8])> = data
            .layers
            .iter()
            .map(|l| (l.media_type.as_str(), l.data.as_ref()))
            .collect();
        unpack_under(image, &layers, prefix)
    }

    /// The manifest digest `image` currently resolves to (what `kubectl-package update` locks).
    #[instrument(skip(self, auth))]
    pub async fn resolve_digest(
        &self,
        image: &str,
        auth: &RegistryAuth,
    ) -> Result<String, ImageError> {
        let reference = parse_reference(image)?;
        self.client(auth)
            .fetch_manifest_digest(&reference, auth)
            .await
            .map_err(|e| registry_error(image, e))
    }

    /// Packs `files` into one gzip'd tar layer under `package/` and pushes it as `image`; returns the
    /// manifest URL the registry reports.
    #[instrument(skip(self, files, auth))]
    pub async fn push(
        &self,
        image: &str,
        files: &PackageFiles,
        auth: &RegistryAuth,
    ) -> Result<String, ImageError> {
        self.push_labelled(image, files, &BTreeMap::new(), auth)
            .await
    }

    /// [`ImageStore::push`] with `labels` in the image config (`kubectl-package build --label`).
    pub async fn push_labelled(
        &self,
        image: &str,
        files: &PackageFiles,
        labels: &BTreeMap<String, String>,
        auth: &RegistryAuth,
    ) -> Result<String, ImageError> {
        self.push_under(image, files, PACKAGE_PREFIX, labels, auth)
            .await
    }

    /// Pushes `files` under `prefix` in one layer (package images use `package/`, repository indexes
    /// `repository/`).
    #[instrument(skip(self, files, labels, auth))]
    pub async fn push_under(
        &self,
        image: &str,
        files: &PackageFiles,
        prefix: &str,
        labels: &BTreeMap<String, String>,
        auth: &RegistryAuth,
    ) -> Result<String, ImageError> {
        let reference = parse_reference(image)?;
        let layer = ImageLayer::new(
            pack_under(files, prefix)?,
            IMAGE_LAYER_GZIP_MEDIA_TYPE.to_owned(),
            None,
        );
        let config = Config::new(
            image_config(labels),
            IMAGE_CONFIG_MEDIA_TYPE.to_owned(),
            None,
        );
        let pushed = self
            .client(auth)
            .push(&reference, &[layer], config, auth, None)
            .await
            .map_err(|e| registry_error(image, e))?;
        Ok(pushed.manifest_url)
    }
}

fn parse_reference(image: &str) -> Result<Reference, ImageError> {
    image
        .parse()
        .map_err(|e: oci_client::ParseError| ImageError::Reference {
            reference: image.to_owned(),
            message: e.to_string(),
        })
}

fn registry_error(image: &str, error: OciDistributionError) -> ImageError {
    let reference = image.to_owned();
    let message = error.to_string();
    match error {
        OciDistributionError::ImageManifestNotFoundError(_) => ImageError::NotFound { reference },
        OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => ImageError::Unauthorized { reference, message },
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown))
            {
                ImageError::NotFound { reference }
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                ImageError::Unauthorized { reference, message }
            } else {
                ImageError::Registry { reference, message }
            }
        }
        _ => ImageError::Registry { reference, message },
    }
}

/// Unpacks image layers (in order; a later layer's file replaces an earlier one) into package files.
pub fn unpack(image: &str, layers: &[(&str, &[u8])]) -> Result<PackageFiles, ImageError> {
    unpack_under(image, layers, PACKAGE_PREFIX)
}

/// Unpacks the files under `prefix` (`""`: all) of image layers, paths relative to it.
pub fn unpack_under(
    image: &str,
    layers: &[(&str, &[u8])],
    prefix: &str,
) -> Result<PackageFiles, ImageError> {
    let mut files = PackageFiles::new();
    for (index, (media_type, data)) in layers.iter().enumerate() {
        let layer_err = |message: String| ImageError::Layer {
            reference: image.to_owned(),
            index,
            message,
        };
        let reader: Box<dyn Read> =
            if media_type.ends_with("+gzip") || media_type.ends_with(".gzip") {
                Box::new(flate2::read::GzDecoder::new(*data))
            } else {
                Box::new(*data)
            };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().map_err(|e| layer_err(e.to_string()))? {
            let mut entry = entry.map_err(|e| layer_err(e.to_string()))?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let path = entry
                .path()
                .map_err(|e| layer_err(e.to_string()))?
                .to_string_lossy()
                .into_owned();
            let path = path.trim_start_matches("./");
            let Some(relative) = path.strip_prefix(prefix) else {
                continue;
            };
            if relative.is_empty() || is_hidden(relative) {
                continue;
            }
            let mut content = Vec::new();
            entry
                .read_to_end(&mut content)
                .map_err(|e| layer_err(e.to_string()))?;
            files.insert(relative.to_owned(), content);
        }
    }
    if files.is_empty() {
        return Err(ImageError::Empty {
            reference: image.to_owned(),
            prefix: prefix.to_owned(),
        });
    }
    Ok(files)
}

/// Appends a regular file with fixed metadata (mode 0644, mtime 0): the same content gives the same bytes.
pub(super) fn append_file<W: std::io::Write>(
    archive: &mut tar::Builder<W>,
    path: &str,
    content: &[u8],
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_cksum();
    archive.append_data(&mut header, path, content)
}

/// The image config of a package image: linux/amd64 as upstream writes it, and `labels` when given.
pub fn image_config(labels: &BTreeMap<String, String>) -> Vec<u8> {
    let mut config = serde_json::json!({"architecture": "amd64", "os": "linux"});
    if !labels.is_empty() {
        config["config"] = serde_json::json!({ "Labels": labels });
    }
    serde_json::to_vec(&config).unwrap_or_default()
}

/// One gzip'd tar of `files` under `package/`, with fixed metadata so the same files give the same bytes.
pub fn pack(files: &PackageFiles) -> Result<Vec<u8>, ImageError> {
    pack_under(files, PACKAGE_PREFIX)
}

/// One gzip'd tar of `files` under `prefix`, with fixed metadata.
pub fn pack_under(files: &PackageFiles, prefix: &str) -> Result<Vec<u8>, ImageError> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut archive = tar::Builder::new(gz);
    for (path, content) in files {
        append_file(&mut archive, &format!("{prefix}{path}"), content)
            .map_err(|e| ImageError::Pack(e.to_string()))?;
    }
    let gz = archive
        .into_inner()
        .map_err(|e| ImageError::Pack(e.to_string()))?;
    gz.finish().map_err(|e| ImageError::Pack(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> PackageFiles {
        pairs
            .iter()
            .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn pack_then_unpack_round_trips_and_is_reproducible() {
        let f = files(&[("manifest.yaml", "m"), ("dir/a.yaml", "a")]);
        let packed = pack(&f).unwrap();
        assert_eq!(packed, pack(&f).unwrap(), "same files, same bytes");
        assert_eq!(
            unpack("img", &[(IMAGE_LAYER_GZIP_MEDIA_TYPE, &packed)]).unwrap(),
            f
        );
    }

    #[test]
    fn later_layers_override_and_hidden_or_foreign_paths_are_dropped() {
        let first = pack(&files(&[("manifest.yaml", "old"), ("keep.yaml", "k")])).unwrap();
        let second = pack(&files(&[("manifest.yaml", "new"), (".hidden/x", "h")])).unwrap();
        let got = unpack(
            "img",
            &[
                (IMAGE_LAYER_GZIP_MEDIA_TYPE, &first),
                (IMAGE_LAYER_GZIP_MEDIA_TYPE, &second),
            ],
        )
        .unwrap();
        assert_eq!(got, files(&[("keep.yaml", "k"), ("manifest.yaml", "new")]));
    }

    #[test]
    fn an_image_without_a_package_is_an_error() {
        let mut plain = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_cksum();
        plain
            .append_data(&mut header, "etc/passwd", &b"x"[..])
            .unwrap();
        let bytes = plain.into_inner().unwrap();
        assert!(matches!(
            unpack("img", &[(IMAGE_LAYER_MEDIA_TYPE, &bytes)]),
            Err(ImageError::Empty { .. })
        ));
        assert!(matches!(
            unpack("img", &[(IMAGE_LAYER_GZIP_MEDIA_TYPE, b"not gzip")]),
            Err(ImageError::Layer { index: 0, .. })
        ));
    }
}
