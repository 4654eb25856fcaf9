//! Where environments keep their files, and starting a shared set of servers for a whole test binary.

use std::future::Future;
use std::path::{Path, PathBuf};

use crate::error::{io_error, TestEnvError};

/// Base directory of environments: `PKO_TESTENV_DIR`, else `/dev/shm/pko-testenv` (etcd and the registry
/// write a lot; memory is faster than disk), else the temp directory.
fn base_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PKO_TESTENV_DIR") {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join("pko-testenv")
    } else {
        std::env::temp_dir().join("pko-testenv")
    }
}

/// The file that marks an environment's directory as kept on purpose (`TestEnv::keep_files`).
pub(crate) const KEPT_MARKER: &str = "kept";

/// A fresh `<base>/<pid>-<n>` directory. Directories of processes that no longer exist (a shared
/// environment outlives its test binary's statics, so nothing dropped it) are removed first, except
/// those kept on purpose.
pub(crate) fn new_root_dir() -> Result<PathBuf, TestEnvError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static ENVIRONMENTS: AtomicU32 = AtomicU32::new(0);
    let base = base_dir();
    std::fs::create_dir_all(&base).map_err(io_error("create directory", &base))?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let owner_alive = name
                .split('-')
                .next()
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| Path::new("/proc").join(pid.to_string()).exists());
            if !owner_alive && !entry.path().join(KEPT_MARKER).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = base.join(format!(
        "{}-{}",
        std::process::id(),
        ENVIRONMENTS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(io_error("create directory", &dir))?;
    Ok(dir)
}

/// Runs `start` to completion on its own thread and runtime: the caller may be inside a runtime that must
/// not block on itself, and that runtime ends with its test, while the servers must live on.
pub(crate) fn start_on_own_runtime<T, F>(
    start: impl FnOnce() -> F + Send + 'static,
) -> Result<T, String>
where
    T: Send + 'static,
    F: Future<Output = Result<T, TestEnvError>>,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("cannot build a tokio runtime: {error}"))?;
        runtime.block_on(start()).map_err(|error| error.to_string())
    })
    .join()
    .unwrap_or_else(|_| Err("the start-up thread panicked".to_owned()))
}
