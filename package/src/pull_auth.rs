//! Registry credentials from Kubernetes pull secrets: `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`,
//! `{"auths": {host: ...}}`) and the legacy `kubernetes.io/dockercfg` (`.dockercfg`, `{host: ...}`).
//! An entry gives `username`/`password` or `auth` (base64 of `user:password`); keys may carry a scheme
//! and a path (`https://index.docker.io/v1/`). The first secret with an entry for the image's registry
//! wins, as the kubelet does; no entry means an anonymous pull.
//!
//! Pure: the secrets' data in, credentials out. Reading the ServiceAccount and Secrets is the actor's.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

/// Basic credentials for a registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

const DOCKER_HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// The registry host of an image reference (`docker.io` for `nginx` or `library/nginx`).
pub fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// `https://host:port/v1/` → `host:port`.
fn normalize_key(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

fn same_registry(a: &str, b: &str) -> bool {
    a == b || (DOCKER_HUB.contains(&a) && DOCKER_HUB.contains(&b))
}

fn entry_credentials(entry: &Value) -> Option<Credentials> {
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if let (Some(username), Some(password)) = (field("username"), field("password")) {
        return Some(Credentials {
            username: username.to_owned(),
            password: password.to_owned(),
        });
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(field("auth")?)
        .ok()?;
    let (username, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(Credentials {
        username: username.to_owned(),
        password: password.to_owned(),
    })
}

/// The entries of one pull secret's data (keys as in `Secret.data`, values already decoded).
fn entries(data: &BTreeMap<String, Vec<u8>>) -> Vec<(String, Value)> {
    let parse = |key: &str| -> Option<Value> { serde_json::from_slice(data.get(key)?).ok() };
    let auths = parse(".dockerconfigjson")
        .and_then(|v| v.get("auths").cloned())
        .or_else(|| parse(".dockercfg"));
    match auths {
        Some(Value::Object(map)) => map.into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Credentials for `image` from the pull secrets' data, in secret order.
pub fn credentials_for(image: &str, secrets: &[BTreeMap<String, Vec<u8>>]) -> Option<Credentials> {
    let host = registry_host(image);
    secrets.iter().find_map(|data| {
        entries(data)
            .into_iter()
            .filter(|(key, _)| same_registry(normalize_key(key), host))
            .find_map(|(_, entry)| entry_credentials(&entry))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(key: &str, value: Value) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(key.to_owned(), value.to_string().into_bytes())])
    }

    #[test]
    fn hosts_of_image_references() {
        assert_eq!(registry_host("127.0.0.1:5000/pkg:v1"), "127.0.0.1:5000");
        assert_eq!(registry_host("quay.io/org/pkg@sha256:ab"), "quay.io");
        assert_eq!(registry_host("library/nginx"), "docker.io");
        assert_eq!(registry_host("nginx"), "docker.io");
        assert_eq!(registry_host("localhost/pkg"), "localhost");
    }

    #[test]
    fn dockerconfigjson_with_username_or_auth() {
        let s = secret(
            ".dockerconfigjson",
            json!({"auths": {
                "https://quay.io/v1/": {"username": "u", "password": "p"},
                "127.0.0.1:5000": {"auth": base64::engine::general_purpose::STANDARD.encode("pko:s3:cret")},
            }}),
        );
        let quay = credentials_for("quay.io/org/pkg:v1", std::slice::from_ref(&s)).unwrap();
        assert_eq!((quay.username.as_str(), quay.password.as_str()), ("u", "p"));
        let local = credentials_for("127.0.0.1:5000/pkg:v1", std::slice::from_ref(&s)).unwrap();
        assert_eq!(
            (local.username.as_str(), local.password.as_str()),
            ("pko", "s3:cret")
        );
        assert_eq!(credentials_for("ghcr.io/x:v1", &[s]), None);
    }

    #[test]
    fn legacy_dockercfg_docker_hub_aliases_and_secret_order() {
        let legacy = secret(
            ".dockercfg",
            json!({"https://index.docker.io/v1/": {"username": "a", "password": "1"}}),
        );
        let later = secret(
            ".dockerconfigjson",
            json!({"auths": {"docker.io": {"username": "b", "password": "2"}}}),
        );
        let found = credentials_for("nginx:1", &[legacy, later]).unwrap();
        assert_eq!(found.username, "a");
        assert!(
            !format!("{found:?}").contains('1'),
            "the password is never printed"
        );
    }

    #[test]
    fn malformed_secrets_are_skipped() {
        let broken = BTreeMap::from([(".dockerconfigjson".to_owned(), b"{not json".to_vec())]);
        let bad_auth = secret(
            ".dockerconfigjson",
            json!({"auths": {"quay.io": {"auth": "!!"}}}),
        );
        let good = secret(
            ".dockerconfigjson",
            json!({"auths": {"quay.io": {"username": "u", "password": "p"}}}),
        );
        assert_eq!(
            credentials_for("quay.io/a:b", &[broken, bad_auth, good])
                .unwrap()
                .username,
            "u"
        );
    }
}
