//! Package images pushed to the test environment's registry, and Packages made from them.

use kube::api::PostParams;
use kube::Api;
use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::ImageStore;
use pko_proto::core::package::Package;
use serde_json::json;

use super::env;

/// Pushes `files` as the package image `packages/<tag>`; returns its reference.
pub async fn push(tag: &str, files: &[(&str, &str)]) -> String {
    let host = env().registry().host();
    let image = format!("{host}/packages/{tag}");
    let files: PackageFiles = files
        .iter()
        .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
        .collect();
    ImageStore::new(vec![host])
        .push(&image, &files, &RegistryAuth::Anonymous)
        .await
        .unwrap();
    image
}

/// Creates Package `name` in `ns` from `image` with `config`.
pub async fn create_package(
    client: &kube::Client,
    ns: &str,
    name: &str,
    image: &str,
    config: serde_json::Value,
) {
    Api::<Package>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &package(name, image, config))
        .await
        .unwrap();
}

pub fn package(name: &str, image: &str, config: serde_json::Value) -> Package {
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
        "metadata": {"name": name}, "spec": {"image": image, "config": config},
    }))
    .unwrap()
}
