//! Reading the workspace's sources as text, for the tests that check their shape.

use std::path::{Path, PathBuf};

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("engine/ lives in the workspace root")
        .to_owned()
}

/// Every `.rs` file under `dir`, recursively.
pub fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// How many of a file's lines are production code: those before its `#[cfg(test)]` module.
pub fn production(lines: &[&str]) -> usize {
    lines
        .windows(2)
        .position(|pair| pair[0].trim() == "#[cfg(test)]" && pair[1].starts_with("mod "))
        .unwrap_or(lines.len())
}
