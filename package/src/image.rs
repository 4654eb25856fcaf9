//! Package images: an OCI image whose layers are tar archives holding the package under `package/`. Pull
//! (anonymous or with credentials), unpack (later layers override earlier ones, dot-paths ignored) within
//! the [`ImageLimits`], cache by manifest digest (least recently used go first past the cache's byte
//! budget) so an image is downloaded once, and build/push from a package directory.

use std::collections::BTreeMap;
use std::io::Read;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use dashmap::DashMap;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tracing::instrument;

use super::digest_cache::DigestCache;
use super::files::{is_hidden, PackageFiles};
use super::image_limits::{
    check_entry_type, check_path, read_file, BoundedStream, ImageLimits, LimitViolation,
};
use super::image_reference;
use super::registry_slots::RegistrySlots;

/// How long connecting to a registry may take.
const REGISTRY_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a registry may stay silent while answering a request.
const REGISTRY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
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
    #[error("image {reference}: {violation}")]
    Limit {
        reference: String,
        violation: LimitViolation,
    },
    #[error("packing the package: {0}")]
    Pack(String),
}

impl ImageError {
    /// True when the image itself breaks a limit: pulling it again gives the same answer.
    pub fn is_limit(&self) -> bool {
        matches!(self, ImageError::Limit { .. })
    }
}

/// Pulls, caches and pushes package images; cheap to share.
pub struct ImageStore {
    protocol: ClientProtocol,
    limits: ImageLimits,
    by_digest: Mutex<DigestCache>,
    /// One registry client per set of credentials (see [`ImageStore::client`]).
    clients: DashMap<String, Client>,
    /// Bounds registry operations in flight.
    slots: RegistrySlots,
    /// Per digest being downloaded, the lock its download holds: fetches of the same image that
    /// miss the cache while it is pulled wait for it instead of pulling it again.
    pulling: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    pulls: AtomicU64,
    cache_hits: AtomicU64,
}

impl ImageStore {
    /// `insecure_registries` are reached over plain HTTP (local registries).
    pub fn new(insecure_registries: Vec<String>) -> Self {
        Self::with_limits(insecure_registries, ImageLimits::default())
    }

    /// Like [`ImageStore::new`], unpacking within `limits`.
    pub fn with_limits(insecure_registries: Vec<String>, limits: ImageLimits) -> Self {
        let protocol = if insecure_registries.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(insecure_registries)
        };
        Self {
            protocol,
            limits,
            by_digest: Mutex::new(DigestCache::new(limits.cache_bytes)),
            clients: DashMap::new(),
            slots: RegistrySlots::default(),
            pulling: DashMap::new(),
            pulls: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, DigestCache> {
        // Every change to the cache is one call: a panic elsewhere cannot leave it half-changed.
        self.by_digest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes of unpacked packages the cache holds now.
    pub fn cached_bytes(&self) -> u64 {
        self.cache().bytes()
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
                    // A registry that accepts and then says nothing must fail the pull (and let a
                    // newer spec be unpacked), not hold it forever; a slow but moving download goes on.
                    connect_timeout: Some(REGISTRY_CONNECT_TIMEOUT),
                    read_timeout: Some(REGISTRY_READ_TIMEOUT),
                    ..ClientConfig::default()
                })
            })
            .clone()
    }

    /// How many images were actually downloaded (cache misses).
    pub fn pulls(&self) -> u64 {
        self.pulls.load(Ordering::Relaxed)
    }

    /// How many fetches the cache answered (the digest was known).
    pub fn cache_hits(&self) -> u64 {
        self.cache_hits.load(Ordering::Relaxed)
    }

    /// The package files of `image` and the image's manifest digest. Resolves the digest first and
    /// downloads layers only for a digest not seen before, once however many fetch it at the same
    /// time.
    #[instrument(skip(self, auth))]
    pub async fn fetch(
        &self,
        image: &str,
        auth: &RegistryAuth,
    ) -> Result<(String, Arc<PackageFiles>), ImageError> {
        let reference = parse_reference(image)?;
        let client = self.client(auth);
        let digest = {
            let _slot = self.slot(image).await?;
            client
                .fetch_manifest_digest(&reference, auth)
                .await
                .map_err(|e| registry_error(image, e))?
        };
        if let Some(files) = self.cached(&digest) {
            return Ok((digest, files));
        }
        // Waiting here holds no registry slot: the download it waits for needs one.
        let download = self.pulling.entry(digest.clone()).or_default().clone();
        let _downloading = download.lock().await;
        if let Some(files) = self.cached(&digest) {
            return Ok((digest, files));
        }
        let pulled = async {
            let _slot = self.slot(image).await?;
            self.pull_files(image, &reference, PACKAGE_PREFIX, auth)
                .await
        }
        .await;
        let files = pulled.map(Arc::new);
        if let Ok(files) = &files {
            self.pulls.fetch_add(1, Ordering::Relaxed);
            self.cache().insert(digest.clone(), files.clone());
        }
        // Gone once cached (or failed: the next waiter tries itself); a fetch that missed the cache
        // before the insert finds it there once it holds a lock of its own.
        self.pulling.remove(&digest);
        Ok((digest, files?))
    }

    /// The files of `digest` when the cache holds them, counted as a hit.
    fn cached(&self, digest: &str) -> Option<Arc<PackageFiles>> {
        let files = self.cache().get(digest)?;
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(files)
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
        let _slot = self.slot(image).await?;
        self.pull_files(image, &reference, prefix, auth).await
    }

    /// A place among the registry operations in flight for `image`, held until it is dropped.
    async fn slot(&self, image: &str) -> Result<tokio::sync::SemaphorePermit<'_>, ImageError> {
        self.slots.take().await.map_err(|e| ImageError::Registry {
            reference: image.to_owned(),
            message: e.to_string(),
        })
    }

    /// Registry operations waiting for a place among those in flight now.
    pub fn registry_operations_waiting(&self) -> usize {
        self.slots.waiting()
    }

    /// Downloads the layers of `reference` and unpacks the files under `prefix`. The manifest's layer
    /// sizes are checked first, and each download stops at its declared size (the digest check needs
    /// no more), so a registry that lies about a size cannot fill the memory.
    async fn pull_files(
        &self,
        image: &str,
        reference: &Reference,
        prefix: &str,
        auth: &RegistryAuth,
    ) -> Result<PackageFiles, ImageError> {
        let client = self.client(auth);
        let (manifest, _) = client
            .pull_image_manifest(reference, auth)
            .await
            .map_err(|e| registry_error(image, e))?;
        let limit = |violation| ImageError::Limit {
            reference: image.to_owned(),
            violation,
        };
        let declared: u64 = manifest
            .layers
            .iter()
            .map(|l| u64::try_from(l.size).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        if declared > self.limits.max_layer_bytes {
            return Err(limit(LimitViolation::LayerBytes {
                bytes: declared,
                limit: self.limits.max_layer_bytes,
            }));
        }
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (index, layer) in manifest.layers.iter().enumerate() {
            if ![IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE]
                .contains(&layer.media_type.as_str())
            {
                return Err(ImageError::Layer {
                    reference: image.to_owned(),
                    index,
                    message: format!("media type {} is not a tar layer", layer.media_type),
                });
            }
            let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
            let mut data = CappedBuffer::new(size);
            let pulled = client.pull_blob(reference, layer, &mut data).await;
            if data.overflowed {
                return Err(ImageError::Layer {
                    reference: image.to_owned(),
                    index,
                    message: format!("the registry sent more than the {size} bytes declared"),
                });
            }
            pulled.map_err(|e| registry_error(image, e))?;
            layers.push((layer.media_type.clone(), data.bytes));
        }
        let layers: Vec<(&str, &[u8])> = layers
            .iter()
            .map(|(media_type, data)| (media_type.as_str(), data.as_slice()))
            .collect();
        unpack_under(image, &layers, prefix, &self.limits)
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
    image_reference::parse_reference(image).map_err(|e| ImageError::Reference {
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

/// A download buffer that refuses bytes past `cap`.
struct CappedBuffer {
    bytes: Vec<u8>,
    cap: u64,
    overflowed: bool,
}

impl CappedBuffer {
    fn new(cap: u64) -> Self {
        Self {
            bytes: Vec::new(),
            cap,
            overflowed: false,
        }
    }
}

impl tokio::io::AsyncWrite for CappedBuffer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if (self.bytes.len() + buf.len()) as u64 > self.cap {
            self.overflowed = true;
            return Poll::Ready(Err(std::io::Error::other("more bytes than declared")));
        }
        self.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Unpacks image layers (in order; a later layer's file replaces an earlier one) into package files,
/// within the default limits.
pub fn unpack(image: &str, layers: &[(&str, &[u8])]) -> Result<PackageFiles, ImageError> {
    unpack_under(image, layers, PACKAGE_PREFIX, &ImageLimits::default())
}

/// Unpacks the files under `prefix` (`""`: all) of image layers, paths relative to it, within `limits`:
/// every limit is checked while reading, so a bomb stops at the limit, not after it is unpacked.
pub fn unpack_under(
    image: &str,
    layers: &[(&str, &[u8])],
    prefix: &str,
    limits: &ImageLimits,
) -> Result<PackageFiles, ImageError> {
    let mut files = PackageFiles::new();
    let mut unpacked: u64 = 0;
    let mut kept: u64 = 0;
    let limit = |violation| ImageError::Limit {
        reference: image.to_owned(),
        violation,
    };
    for (index, (media_type, data)) in layers.iter().enumerate() {
        let layer_err = |e: std::io::Error| match LimitViolation::of(&e) {
            Some(violation) => limit(violation),
            None => ImageError::Layer {
                reference: image.to_owned(),
                index,
                message: e.to_string(),
            },
        };
        let compressed = media_type.ends_with("+gzip") || media_type.ends_with(".gzip");
        let reader: Box<dyn Read> = if compressed {
            Box::new(flate2::read::GzDecoder::new(*data))
        } else {
            Box::new(*data)
        };
        let budget = limits.max_unpacked_bytes.saturating_sub(unpacked);
        let mut archive = tar::Archive::new(BoundedStream::new(
            reader,
            budget,
            compressed.then_some(data.len() as u64),
            limits,
        ));
        for entry in archive.entries().map_err(layer_err)? {
            let mut entry = entry.map_err(layer_err)?;
            let path = entry.path().map_err(layer_err)?.into_owned();
            check_path(&path).map_err(limit)?;
            let path_text = path.to_string_lossy().into_owned();
            let path_text = path_text.trim_start_matches("./");
            let Some(relative) = path_text.strip_prefix(prefix) else {
                continue;
            };
            if relative.is_empty() || is_hidden(relative) {
                continue;
            }
            if !check_entry_type(&path, entry.header().entry_type()).map_err(limit)? {
                continue;
            }
            kept += 1;
            if kept > limits.max_files {
                return Err(limit(LimitViolation::Files {
                    limit: limits.max_files,
                }));
            }
            let content = read_file(&mut entry, relative, limits).map_err(layer_err)?;
            files.insert(relative.to_owned(), content);
        }
        unpacked = unpacked.saturating_add(archive.into_inner().read_bytes());
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
    use crate::registry_slots::REGISTRY_OPERATIONS_IN_FLIGHT;

    /// A registry that takes connections and never answers; the number it took so far.
    fn silent_registry(
        listener: tokio::net::TcpListener,
    ) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                held.push(connection);
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        (accepted, server)
    }

    /// Polls `condition` until it holds, failing after ten seconds.
    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn registry_operations_in_flight_are_bounded() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (accepted, server) = silent_registry(listener);
        let store = Arc::new(ImageStore::new(vec![host.clone()]));
        let image = format!("{host}/bounded/package:v1");
        let fetches = 3 * REGISTRY_OPERATIONS_IN_FLIGHT;
        let attempts: Vec<_> = (0..fetches)
            .map(|_| {
                let (store, image) = (store.clone(), image.clone());
                tokio::spawn(async move { store.fetch(&image, &RegistryAuth::Anonymous).await })
            })
            .collect();
        let queued = fetches - REGISTRY_OPERATIONS_IN_FLIGHT;
        eventually("the fetches beyond the bound wait", || {
            store.registry_operations_waiting() == queued
        })
        .await;
        eventually("the fetches within the bound reach the registry", || {
            accepted.load(Ordering::SeqCst) == REGISTRY_OPERATIONS_IN_FLIGHT as u64
        })
        .await;
        // The waiting ones hold no connection: only the bound's worth reached the registry.
        assert_eq!(store.registry_operations_waiting(), queued);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            REGISTRY_OPERATIONS_IN_FLIGHT as u64
        );
        // The registry goes away: every fetch fails, none hangs.
        server.abort();
        for attempt in attempts {
            assert!(attempt.await.unwrap().is_err());
        }
        assert_eq!(store.registry_operations_waiting(), 0);
    }

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

    /// A plain tar layer with one entry of `entry_type` at `path` (raw header bytes, so even paths the
    /// tar crate's builder refuses can be written).
    fn layer_with(path: &str, entry_type: tar::EntryType, content: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_entry_type(entry_type);
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        if entry_type == tar::EntryType::Symlink || entry_type == tar::EntryType::Link {
            header.set_link_name("/etc/passwd").unwrap();
        }
        header.set_cksum();
        let mut archive = tar::Builder::new(Vec::new());
        archive.append(&header, content).unwrap();
        archive.into_inner().unwrap()
    }

    fn refusal(layers: &[(&str, &[u8])], limits: &ImageLimits) -> String {
        match unpack_under("img", layers, PACKAGE_PREFIX, limits) {
            Err(e @ ImageError::Limit { .. }) => e.to_string(),
            other => panic!("expected a limit, got {other:?}"),
        }
    }

    #[test]
    fn links_and_paths_leaving_the_root_refuse_the_image() {
        let limits = ImageLimits::default();
        let symlink = layer_with("package/evil.yaml", tar::EntryType::Symlink, b"");
        assert_eq!(
            refusal(&[(IMAGE_LAYER_MEDIA_TYPE, &symlink)], &limits),
            "image img: entry \"package/evil.yaml\" is a symlink, which a package may not contain"
        );
        let hardlink = layer_with("package/evil.yaml", tar::EntryType::Link, b"");
        assert!(refusal(&[(IMAGE_LAYER_MEDIA_TYPE, &hardlink)], &limits).contains("hardlink"));
        for path in ["package/../../etc/x", "/package/abs.yaml"] {
            let escaping = layer_with(path, tar::EntryType::Regular, b"x");
            assert!(
                refusal(&[(IMAGE_LAYER_MEDIA_TYPE, &escaping)], &limits)
                    .contains("leaves the image's root"),
                "{path}"
            );
        }
        // A link outside the package directory is none of the package's business.
        let mut outside = layer_with("bin/sh", tar::EntryType::Symlink, b"");
        outside.truncate(outside.len() - 1024);
        outside.extend(layer_with(
            "package/manifest.yaml",
            tar::EntryType::Regular,
            b"m",
        ));
        let files = unpack_under(
            "img",
            &[(IMAGE_LAYER_MEDIA_TYPE, &outside)],
            PACKAGE_PREFIX,
            &limits,
        )
        .unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), ["manifest.yaml"]);
    }

    #[test]
    fn bombs_stop_at_the_limit_they_break() {
        let limits = ImageLimits {
            max_files: 3,
            max_file_bytes: 4 * 1024 * 1024,
            // Zeros compress too well for the ratio to let the file limit speak first.
            max_compression_ratio: 1_000_000,
            ..ImageLimits::default()
        };
        let many = pack(&files(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")])).unwrap();
        assert_eq!(
            refusal(&[(IMAGE_LAYER_GZIP_MEDIA_TYPE, &many)], &limits),
            "image img: holds more than the limit of 3 files (--max-image-files)"
        );
        // 8 MiB of zeros: one file over 4 MiB.
        let zeros = "\0".repeat(8 * 1024 * 1024);
        let big = pack(&files(&[("zeros", zeros.as_str())])).unwrap();
        assert!(refusal(&[(IMAGE_LAYER_GZIP_MEDIA_TYPE, &big)], &limits)
            .contains("file \"zeros\" is larger than the limit of 4194304 bytes"));
        // Many 1 MiB files of zeros: the ratio stops the stream long before they are unpacked.
        let chunk = "\0".repeat(1024 * 1024);
        let names: Vec<String> = (0..40).map(|i| format!("z{i}")).collect();
        let bomb = pack(&files(
            &names
                .iter()
                .map(|n| (n.as_str(), chunk.as_str()))
                .collect::<Vec<_>>(),
        ))
        .unwrap();
        let generous = ImageLimits {
            max_files: 1000,
            ..ImageLimits::default()
        };
        assert!(refusal(&[(IMAGE_LAYER_GZIP_MEDIA_TYPE, &bomb)], &generous)
            .contains("unpacks to more than 100 times its size"));
        let tight_total = ImageLimits {
            max_files: 1000,
            max_unpacked_bytes: 2 * 1024 * 1024,
            max_compression_ratio: 1_000_000,
            ..ImageLimits::default()
        };
        assert!(
            refusal(&[(IMAGE_LAYER_GZIP_MEDIA_TYPE, &bomb)], &tight_total)
                .contains("unpacks to more than the limit of 2097152 bytes")
        );
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
