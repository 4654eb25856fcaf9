//! The package image store against the real registry: push, pull once per digest, clear errors.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::{ImageError, ImageStore};
use pko_package::image_limits::ImageLimits;

/// A store on the open registry, and `manifest` pushed as `store/<repository>:v1` through it.
async fn pushed(repository: &str, manifest: &[u8]) -> (ImageStore, String, String, PackageFiles) {
    let host = pko_testenv::shared_registries().unwrap().open.host();
    let store = ImageStore::new(vec![host.clone()]);
    let files: PackageFiles = [("manifest.yaml".to_owned(), manifest.to_vec())].into();
    let image = format!("{host}/store/{repository}:v1");
    store
        .push(&image, &files, &RegistryAuth::Anonymous)
        .await
        .unwrap();
    (store, host, image, files)
}

#[tokio::test]
async fn an_image_is_downloaded_once_per_digest() {
    let (store, host, image, files) = pushed("cached", b"kind: PackageManifest").await;

    let (digest, first) = store.fetch(&image, &RegistryAuth::Anonymous).await.unwrap();
    let (again, second) = store.fetch(&image, &RegistryAuth::Anonymous).await.unwrap();
    assert!(digest.starts_with("sha256:"));
    assert_eq!(digest, again);
    assert!(
        Arc::ptr_eq(&first, &second),
        "the second fetch is served from the cache"
    );
    assert_eq!(store.pulls(), 1);
    assert_eq!(*first, files);

    // The same content under another tag has the same digest: still one download.
    let other = format!("{host}/store/cached:v2");
    store
        .push(&other, &files, &RegistryAuth::Anonymous)
        .await
        .unwrap();
    store.fetch(&other, &RegistryAuth::Anonymous).await.unwrap();
    assert_eq!(store.pulls(), 1);
    assert_eq!(store.cache_hits(), 2);
}

/// Many Packages of one release ask for its image at once (an instant release over a fleet, ten add-ons
/// of one package): one download, the others served when it is cached.
#[tokio::test]
async fn fetches_of_one_image_at_once_download_it_once() {
    let (store, _, image, _) = pushed("at-once", b"kind: PackageManifest\n# at once").await;
    let fetched =
        futures::future::join_all((0..16).map(|_| store.fetch(&image, &RegistryAuth::Anonymous)))
            .await;
    let fetched: Vec<(String, Arc<PackageFiles>)> =
        fetched.into_iter().map(Result::unwrap).collect();
    assert!(fetched
        .iter()
        .all(|(digest, f)| *digest == fetched[0].0 && Arc::ptr_eq(f, &fetched[0].1)));
    assert_eq!(
        store.pulls(),
        1,
        "16 fetches at once downloaded it more than once"
    );
    assert_eq!(store.cache_hits(), 15);
}

#[tokio::test]
async fn unknown_images_and_bad_references_are_named() {
    let host = pko_testenv::shared_registries().unwrap().open.host();
    let store = ImageStore::new(vec![host.clone()]);
    let missing = format!("{host}/store/missing:v1");
    match store.fetch(&missing, &RegistryAuth::Anonymous).await {
        Err(ImageError::NotFound { reference }) => assert_eq!(reference, missing),
        other => panic!("want NotFound, got {other:?}"),
    }
    assert!(matches!(
        store.fetch("UPPER/Case:!", &RegistryAuth::Anonymous).await,
        Err(ImageError::Reference { .. })
    ));
}

#[tokio::test]
async fn images_over_the_limits_are_refused_before_they_are_held_and_never_cached() {
    let host = pko_testenv::shared_registries().unwrap().open.host();
    let pusher = ImageStore::new(vec![host.clone()]);
    // 32 MiB of zeros in 32 files: a layer of a few tens of KiB.
    let chunk = vec![0u8; 1024 * 1024];
    let mut bomb: PackageFiles = (0..32)
        .map(|i| (format!("zeros-{i}"), chunk.clone()))
        .collect();
    bomb.insert(
        "manifest.yaml".to_owned(),
        b"kind: PackageManifest".to_vec(),
    );
    let image = format!("{host}/store/bomb:v1");
    pusher
        .push(&image, &bomb, &RegistryAuth::Anonymous)
        .await
        .unwrap();

    let store = ImageStore::new(vec![host.clone()]);
    let started = std::time::Instant::now();
    match store.fetch(&image, &RegistryAuth::Anonymous).await {
        Err(e @ ImageError::Limit { .. }) => {
            assert!(e.to_string().contains("(--max-compression-ratio)"), "{e}");
            println!("bomb refused in {:?}: {e}", started.elapsed());
        }
        other => panic!("want a limit, got {other:?}"),
    }
    assert_eq!(
        store.cached_bytes(),
        0,
        "nothing of a refused image is cached"
    );
    assert_eq!(store.pulls(), 0);

    // The layers' declared size is checked before anything is downloaded.
    let small = ImageStore::with_limits(
        vec![host.clone()],
        ImageLimits {
            max_layer_bytes: 1024,
            ..ImageLimits::default()
        },
    );
    match small.fetch(&image, &RegistryAuth::Anonymous).await {
        Err(e @ ImageError::Limit { .. }) => {
            assert!(e.to_string().contains("(--max-image-layer-bytes)"), "{e}")
        }
        other => panic!("want a limit, got {other:?}"),
    }
}
