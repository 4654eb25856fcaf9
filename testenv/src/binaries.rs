//! Where the server binaries are: the platform directory deploy/install-test-components.sh links the
//! Kubernetes, etcd and nats-server it built into, and Debian's packages on PATH.

use std::path::{Path, PathBuf};

use crate::error::TestEnvError;

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
    /// Finds every binary or says which is missing.
    pub fn locate() -> Result<Self, TestEnvError> {
        let platform = platform_dir();
        Ok(Self {
            etcd: in_dir(&platform, "etcd")?,
            kube_apiserver: in_dir(&platform, "kube-apiserver")?,
            kube_controller_manager: in_dir(&platform, "kube-controller-manager")?,
            nats_server: in_dir(&platform, "nats-server")?,
            registry: on_path("docker-registry")?,
            openssl: on_path("openssl")?,
        })
    }
}

/// The kubectl of the platform the environment runs (its version matches the apiserver's), for tests and
/// tools that run kubectl as a user would; `kubectl` on PATH when the platform has none.
pub fn kubectl() -> PathBuf {
    let platform = platform_dir().join("kubectl");
    if platform.is_file() {
        platform
    } else {
        PathBuf::from("kubectl")
    }
}

/// `PKO_PLATFORM_DIR`, else `${XDG_CACHE_HOME:-$HOME/.cache}/pko/platform` (the current version the
/// install script built; `platform-floor` beside it is the floor version).
pub fn platform_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PKO_PLATFORM_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("pko").join("platform")
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
