//! Where the server binaries are: Debian's packages on PATH, kube-apiserver and kube-controller-manager in
//! the cache directory deploy/install-test-components.sh builds them into.

use std::path::{Path, PathBuf};

use crate::error::TestEnvError;

/// Kubernetes version the install script builds.
const KUBE_VERSION: &str = "v1.20.2";
/// Revision of the build recipe in deploy/install-test-components.sh (its patches); part of the cache path.
const KUBE_RECIPE: &str = "pko3";

/// Paths of every server binary.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// nats-server.
    pub nats_server: PathBuf,
    /// docker-registry (distribution).
    pub registry: PathBuf,
    /// openssl, for the service-account signing key.
    pub openssl: PathBuf,
}

impl Binaries {
    /// Finds every binary or says which is missing. `PKO_KUBE_BIN_DIR` overrides the kube binaries'
    /// directory (default `${XDG_CACHE_HOME:-$HOME/.cache}/pko/kube-v1.20.2-pko3`).
    pub fn locate() -> Result<Self, TestEnvError> {
        let kube_dir = kube_bin_dir();
        Ok(Self {
            etcd: on_path("etcd")?,
            kube_apiserver: in_dir(&kube_dir, "kube-apiserver")?,
            kube_controller_manager: in_dir(&kube_dir, "kube-controller-manager")?,
            nats_server: on_path("nats-server")?,
            registry: on_path("docker-registry")?,
            openssl: on_path("openssl")?,
        })
    }
}

fn kube_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PKO_KUBE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache
        .join("pko")
        .join(format!("kube-{KUBE_VERSION}-{KUBE_RECIPE}"))
}

fn in_dir(dir: &Path, binary: &'static str) -> Result<PathBuf, TestEnvError> {
    let path = dir.join(binary);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::MissingBinary {
            binary,
            looked: format!("{} does not exist", path.display()),
        })
    }
}

/// Debian's libfaketime (package `libfaketime`, pulled in by `faketime`), preloaded into a process to
/// shift its clock.
#[cfg(feature = "cluster")]
pub(crate) fn libfaketime() -> Result<PathBuf, TestEnvError> {
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    in_dir(
        &Path::new("/usr/lib").join(multiarch).join("faketime"),
        "libfaketime.so.1",
    )
}

pub(crate) fn on_path(binary: &'static str) -> Result<PathBuf, TestEnvError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
        .ok_or(TestEnvError::MissingBinary {
            binary,
            looked: "not on PATH".to_owned(),
        })
}
