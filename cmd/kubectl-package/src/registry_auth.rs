//! Registry credentials as `docker login` and `podman login` leave them, which is where upstream's CLI
//! (go-containerregistry's default keychain) looks: the Docker config (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`) with its `credHelpers`, `credsStore` and `auths`, then podman's auth file
//! (`$REGISTRY_AUTH_FILE`, else `$XDG_RUNTIME_DIR/containers/auth.json`). pko's
//! `PKO_REGISTRY_USERNAME`/`PKO_REGISTRY_PASSWORD` override them all. No entry: anonymous.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use oci_client::secrets::RegistryAuth;
use pko_package::pull_auth::{credentials_for, registry_host};
use serde_json::Value;

/// The credentials for `image`'s registry.
pub fn auth_for(image: &str) -> RegistryAuth {
    if let (Ok(user), Ok(password)) = (
        std::env::var("PKO_REGISTRY_USERNAME"),
        std::env::var("PKO_REGISTRY_PASSWORD"),
    ) {
        return RegistryAuth::Basic(user, password);
    }
    let host = registry_host(image);
    for file in config_files() {
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let Ok(config) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let helper = config
            .pointer("/credHelpers")
            .and_then(|h| h.get(host))
            .or_else(|| config.get("credsStore"))
            .and_then(Value::as_str);
        if let Some(auth) = helper.and_then(|h| from_helper(h, host)) {
            return auth;
        }
        let data = BTreeMap::from([(".dockerconfigjson".to_owned(), bytes)]);
        if let Some(credentials) = credentials_for(image, &[data]) {
            return RegistryAuth::Basic(credentials.username, credentials.password);
        }
    }
    RegistryAuth::Anonymous
}

fn config_files() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let docker = env("DOCKER_CONFIG")
        .or_else(|| env("HOME").map(|h| h.join(".docker")))
        .map(|d| d.join("config.json"));
    let podman = env("REGISTRY_AUTH_FILE")
        .or_else(|| env("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
    docker.into_iter().chain(podman).collect()
}

/// Asks `docker-credential-<helper>` for `host`'s credentials (its protocol: the host on stdin,
/// `{"Username", "Secret"}` on stdout). A helper that fails or knows nothing gives None.
fn from_helper(helper: &str, host: &str) -> Option<RegistryAuth> {
    let mut child = Command::new(format!("docker-credential-{helper}"))
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(host.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        return None;
    }
    let answer: Value = serde_json::from_slice(&out.stdout).ok()?;
    let field = |k: &str| {
        answer
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    // An identity token (username `<token>`) is an OAuth refresh token, not a password: not usable here.
    let user = field("Username").filter(|u| *u != "<token>")?;
    Some(RegistryAuth::Basic(
        user.to_owned(),
        field("Secret")?.to_owned(),
    ))
}
