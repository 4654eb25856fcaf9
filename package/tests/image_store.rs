//! The package image store against the real registry: push, pull once per digest, clear errors.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::{ImageError, ImageStore};

#[tokio::test]
async fn an_image_is_downloaded_once_per_digest() {
    let host = pko_testenv::shared_registries().unwrap().open.host();
    let store = ImageStore::new(vec![host.clone()]);
    let files: PackageFiles = [(
        "manifest.yaml".to_owned(),
        b"kind: PackageManifest".to_vec(),
    )]
    .into();
    let image = format!("{host}/store/cached:v1");
    store
        .push(&image, &files, &RegistryAuth::Anonymous)
        .await
        .unwrap();

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
