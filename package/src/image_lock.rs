//! The manifest's `spec.images` and the lock file that pins them: every image a package names must be
//! locked to a digest (`kubectl-package update` writes the lock), and templates see each one as
//! `.images.<name>` = `<repository>@<digest>`, so a package always deploys the exact images it was
//! built with.
//!
//! Pure: the registry lookups of `update` are the CLI's; this module only checks and formats.

use std::collections::BTreeMap;

use pko_proto::manifests::{
    PackageManifest, PackageManifestLock, PackageManifestLockImage, PackageManifestLockSpec,
};

use super::manifest::PackageError;
use super::violation::{reason, Violation};

/// `REPOSITORY[:TAG][@DIGEST]` without tag and digest (a registry port is not a tag).
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(repo, _)| repo);
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].rfind(':') {
        Some(i) => &image[..name_start + i],
        None => image,
    }
}

fn valid_digest(digest: &str) -> bool {
    digest.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && hex.len() >= 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// The `.images` template map: name → `repository@digest`. `lock` is (file, lock) when the package has
/// one. Fails, in upstream's words, when an image is not locked, locked to another reference, or has a
/// malformed digest.
pub fn resolve_images(
    manifest: &PackageManifest,
    lock: Option<(&str, &PackageManifestLock)>,
) -> Result<BTreeMap<String, String>, PackageError> {
    if manifest.spec.images.is_empty() && lock.is_none() {
        return Ok(BTreeMap::new());
    }
    let Some((lock_file, lock)) = lock else {
        return Err(Violation::new(reason::LOCK_MISSING_IMAGE)
            .in_file("manifest.lock.yaml")
            .into());
    };
    let mut resolved = BTreeMap::new();
    for image in &manifest.spec.images {
        let Some(entry) = lock.spec.images.iter().find(|l| l.name == image.name) else {
            return Err(Violation::new(reason::LOCK_MISSING_IMAGE)
                .details(image.name.clone())
                .into());
        };
        if entry.image != image.image {
            return Err(Violation::new(reason::LOCK_IMAGE_MISMATCH)
                .details(format!(
                    "{:?}: {:?} vs {:?}",
                    image.name, image.image, entry.image
                ))
                .into());
        }
        if !valid_digest(&entry.digest) {
            return Err(Violation::new(reason::LOCK_INVALID)
                .in_file(lock_file)
                .details(format!(
                    "spec.images: image {:?}: digest {:?} is not <algorithm>:<hex>",
                    image.name, entry.digest
                ))
                .into());
        }
        resolved.insert(
            image.name.clone(),
            format!("{}@{}", repository(&image.image), entry.digest),
        );
    }
    if let Some(extra) = lock
        .spec
        .images
        .iter()
        .find(|l| !manifest.spec.images.iter().any(|i| i.name == l.name))
    {
        return Err(Violation::new(reason::LOCK_IMAGE_MISMATCH)
            .details(extra.name.clone())
            .into());
    }
    Ok(resolved)
}

/// The lock file for `manifest`, given each image's digest (keyed by image name).
pub fn lock_for(
    manifest: &PackageManifest,
    digests: &BTreeMap<String, String>,
) -> PackageManifestLock {
    PackageManifestLock {
        api_version: format!("{}/{}", pko_proto::MANIFESTS_GROUP, pko_proto::VERSION),
        kind: "PackageManifestLock".to_owned(),
        metadata: Default::default(),
        spec: PackageManifestLockSpec {
            images: manifest
                .spec
                .images
                .iter()
                .map(|i| PackageManifestLockImage {
                    name: i.name.clone(),
                    image: i.image.clone(),
                    digest: digests.get(&i.name).cloned().unwrap_or_default(),
                })
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::manifests::PackageManifestImage;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest(images: &[(&str, &str)]) -> PackageManifest {
        let mut m = PackageManifest::default();
        m.spec.images = images
            .iter()
            .map(|(n, i)| PackageManifestImage {
                name: (*n).to_owned(),
                image: (*i).to_owned(),
            })
            .collect();
        m
    }

    #[test]
    fn repositories_drop_tag_and_digest_but_keep_ports() {
        assert_eq!(repository("127.0.0.1:5000/app:v1"), "127.0.0.1:5000/app");
        assert_eq!(repository("127.0.0.1:5000/app"), "127.0.0.1:5000/app");
        assert_eq!(repository("quay.io/a/b:1@sha256:ab"), "quay.io/a/b");
        assert_eq!(repository("nginx"), "nginx");
    }

    #[test]
    fn locked_images_resolve_to_repository_at_digest() {
        let m = manifest(&[("app", "127.0.0.1:5000/app:v1")]);
        let digests = BTreeMap::from([("app".to_owned(), DIGEST.to_owned())]);
        let lock = lock_for(&m, &digests);
        let images = resolve_images(&m, Some(("manifest.lock.yaml", &lock))).unwrap();
        assert_eq!(images["app"], format!("127.0.0.1:5000/app@{DIGEST}"));
        assert!(resolve_images(&manifest(&[]), None).unwrap().is_empty());
    }

    #[test]
    fn missing_stale_or_malformed_locks_are_errors() {
        let m = manifest(&[("app", "app:v2")]);
        assert_eq!(
            resolve_images(&m, None).unwrap_err().to_string(),
            "Missing image in manifest.lock.yaml, but using PackageManifest.spec.images. Try running: kubectl package update in manifest.lock.yaml"
        );
        let stale = lock_for(
            &manifest(&[("app", "app:v1")]),
            &BTreeMap::from([("app".to_owned(), DIGEST.to_owned())]),
        );
        assert_eq!(
            resolve_images(&m, Some(("manifest.lock.yaml", &stale))).unwrap_err().to_string(),
            "Image specified in manifest does not match with lockfile. Try running: kubectl package update: \"app\": \"app:v2\" vs \"app:v1\""
        );
        let bad = lock_for(
            &m,
            &BTreeMap::from([("app".to_owned(), "latest".to_owned())]),
        );
        assert!(resolve_images(&m, Some(("manifest.lock.yaml", &bad))).is_err());
        let extra = lock_for(
            &manifest(&[("app", "app:v2"), ("db", "db:1")]),
            &BTreeMap::from([
                ("app".to_owned(), DIGEST.to_owned()),
                ("db".to_owned(), DIGEST.to_owned()),
            ]),
        );
        assert_eq!(
            resolve_images(&m, Some(("manifest.lock.yaml", &extra)))
                .unwrap_err()
                .to_string(),
            "Image specified in manifest does not match with lockfile. Try running: kubectl package update: db"
        );
    }
}
