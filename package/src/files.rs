//! The files of a package, by path relative to the package root (`/`-separated). Paths with a component
//! starting with `.` are not part of a package (editor files, `.git`, `.test-fixtures`), and neither are
//! symlinks: a directory is imported as upstream imports it.

use std::collections::BTreeMap;
use std::path::Path;

/// File contents by package-relative path.
pub type PackageFiles = BTreeMap<String, Vec<u8>>;

/// True for paths a package ignores.
pub fn is_hidden(path: &str) -> bool {
    path.split('/').any(|c| c.starts_with('.'))
}

/// Reads every file under `root` (a directory; symlinks are skipped, not followed).
pub fn from_dir(root: &Path) -> std::io::Result<PackageFiles> {
    let mut files = PackageFiles::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let Ok(relative) = path.strip_prefix(root) else {
                continue;
            };
            let relative = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            if is_hidden(&relative) {
                continue;
            }
            let file_type = entry.file_type()?;
            if file_type.is_symlink() {
                continue;
            } else if file_type.is_dir() {
                pending.push(path);
            } else {
                files.insert(relative, std::fs::read(&path)?);
            }
        }
    }
    Ok(files)
}
