//! Running the `kubectl-package` binary from the test binaries: in the example packages' directory or
//! in a scratch directory of the test's own.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `tests/packages/`, the example packages.
pub fn packages() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packages")
}

/// Runs the binary in `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-package"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Runs the binary in `tests/packages/`.
pub fn run(args: &[&str]) -> Output {
    run_in(&packages(), args)
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An empty directory of this test process, named by `tag`.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pko-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
