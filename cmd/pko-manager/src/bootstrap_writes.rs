//! What the bootstrap commands did to each object or file they keep, and how they write a file: shared by
//! `nats-bootstrap` and `nats-bootstrap fleet`.

use std::path::Path;

/// What happened to one object or file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Created,
    Updated,
    Unchanged,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Written::Created => "created",
            Written::Updated => "updated",
            Written::Unchanged => "unchanged",
        })
    }
}

/// Writes `text` to `path` unless it holds it already. A `secret` file is created readable by its owner
/// only, and an existing one is made so.
pub fn write_file(path: &Path, text: &str, secret: bool) -> Result<Written, std::io::Error> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let current = std::fs::read_to_string(path).ok();
    if current.as_deref() == Some(text) {
        return Ok(Written::Unchanged);
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        options.mode(0o600);
        if current.is_some() {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    options.open(path)?.write_all(text.as_bytes())?;
    Ok(if current.is_some() {
        Written::Updated
    } else {
        Written::Created
    })
}
