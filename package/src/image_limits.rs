//! What a package image may hold: limits on the layers downloaded, the bytes unpacked, the number and size
//! of files and the compression ratio, and the tar entries an image may contain at all. A package image
//! is input from any tenant of a management cluster, so every limit is checked while reading, before the
//! bytes it guards are held, and a violation names the limit. It only checks; unpacking is `image.rs`.

use std::io::{self, Read};
use std::path::{Component, Path};

use tar::EntryType;

const MIB: u64 = 1024 * 1024;

/// Limits on one image; see the defaults for their values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Bytes of all layers together, as downloaded (compressed).
    pub max_layer_bytes: u64,
    /// Bytes of the unpacked tar streams of all layers together.
    pub max_unpacked_bytes: u64,
    /// Files in the image.
    pub max_files: u64,
    /// Bytes of one file.
    pub max_file_bytes: u64,
    /// Unpacked bytes per compressed byte of a layer; checked once a layer unpacks to more than 1 MiB,
    /// so small packages of many tiny files (tar headers compress to almost nothing) pass.
    pub max_compression_ratio: u64,
    /// Bytes of unpacked packages the pull cache keeps (least recently used go first).
    pub cache_bytes: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_layer_bytes: 64 * MIB,
            max_unpacked_bytes: 64 * MIB,
            max_files: 10_000,
            max_file_bytes: 16 * MIB,
            max_compression_ratio: 100,
            cache_bytes: 256 * MIB,
        }
    }
}

/// An image breaks a limit or holds an entry no package may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitViolation {
    #[error("layers of {bytes} bytes exceed the limit of {limit} bytes (--max-image-layer-bytes)")]
    LayerBytes { bytes: u64, limit: u64 },
    #[error("unpacks to more than the limit of {limit} bytes (--max-unpacked-bytes)")]
    UnpackedBytes { limit: u64 },
    #[error("holds more than the limit of {limit} files (--max-image-files)")]
    Files { limit: u64 },
    #[error("file {path:?} is larger than the limit of {limit} bytes (--max-image-file-bytes)")]
    FileBytes { path: String, limit: u64 },
    #[error("layer of {compressed} bytes unpacks to more than {ratio} times its size (--max-compression-ratio)")]
    CompressionRatio { compressed: u64, ratio: u64 },
    #[error("entry {path:?} is a {kind}, which a package may not contain")]
    EntryType { path: String, kind: &'static str },
    #[error("entry {path:?} leaves the image's root (absolute, or with a .. component)")]
    EscapingPath { path: String },
}

impl LimitViolation {
    /// Carried inside an `io::Error` out of a reader, and recognised again by [`LimitViolation::of`].
    fn into_io(self) -> io::Error {
        io::Error::other(self)
    }

    /// The violation an I/O error carries, if it is one.
    pub fn of(error: &io::Error) -> Option<LimitViolation> {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<LimitViolation>())
            .cloned()
    }
}

/// Reads a layer's tar stream, failing once it yields more than the total or the ratio allows.
pub struct BoundedStream<R> {
    inner: R,
    read: u64,
    /// Bytes this layer may still yield under `max_unpacked_bytes`.
    budget: u64,
    /// The ratio bound, when the layer is compressed: (compressed size, ratio).
    ratio: Option<(u64, u64)>,
}

impl<R: Read> BoundedStream<R> {
    /// `budget`: what is left of the total; `compressed`: the layer's size when it is compressed.
    pub fn new(inner: R, budget: u64, compressed: Option<u64>, limits: &ImageLimits) -> Self {
        Self {
            inner,
            read: 0,
            budget,
            ratio: compressed.map(|c| (c, limits.max_compression_ratio)),
        }
    }

    /// Bytes read so far.
    pub fn read_bytes(&self) -> u64 {
        self.read
    }
}

impl<R: Read> Read for BoundedStream<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read = self.read.saturating_add(n as u64);
        if self.read > self.budget {
            return Err(LimitViolation::UnpackedBytes { limit: self.budget }.into_io());
        }
        if let Some((compressed, ratio)) = self.ratio {
            let allowed = compressed.saturating_mul(ratio).max(MIB);
            if self.read > allowed {
                return Err(LimitViolation::CompressionRatio { compressed, ratio }.into_io());
            }
        }
        Ok(n)
    }
}

/// Refuses a tar entry whose path leaves the image's root (absolute, or with a `..` component), wherever
/// it is: no well-formed image has one.
pub fn check_path(path: &Path) -> Result<(), LimitViolation> {
    if path.components().any(|c| {
        matches!(
            c,
            Component::ParentDir | Component::RootDir | Component::Prefix(_)
        )
    }) {
        return Err(LimitViolation::EscapingPath {
            path: path.to_string_lossy().into_owned(),
        });
    }
    Ok(())
}

/// Whether an entry of the package is kept (a regular file) or skipped (a directory); links and devices
/// refuse the whole image: a package is plain files, and anything else in it is a mistake or an attack.
pub fn check_entry_type(path: &Path, entry_type: EntryType) -> Result<bool, LimitViolation> {
    let kind = match entry_type {
        EntryType::Regular | EntryType::Continuous => return Ok(true),
        EntryType::Directory => return Ok(false),
        EntryType::Symlink => "symlink",
        EntryType::Link => "hardlink",
        EntryType::Char => "character device",
        EntryType::Block => "block device",
        EntryType::Fifo => "fifo",
        _ => "special entry",
    };
    Err(LimitViolation::EntryType {
        path: path.to_string_lossy().into_owned(),
        kind,
    })
}

/// Reads one file's content, refusing it past `max_file_bytes` without holding more than that.
pub fn read_file(entry: &mut impl Read, path: &str, limits: &ImageLimits) -> io::Result<Vec<u8>> {
    let mut content = Vec::new();
    entry
        .take(limits.max_file_bytes.saturating_add(1))
        .read_to_end(&mut content)?;
    if content.len() as u64 > limits.max_file_bytes {
        return Err(LimitViolation::FileBytes {
            path: path.to_owned(),
            limit: limits.max_file_bytes,
        }
        .into_io());
    }
    Ok(content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_devices_and_escaping_paths_are_refused_directories_skipped() {
        assert_eq!(
            check_entry_type(Path::new("package/a.yaml"), EntryType::Regular),
            Ok(true)
        );
        assert_eq!(
            check_entry_type(Path::new("package/dir"), EntryType::Directory),
            Ok(false)
        );
        for (path, entry_type, expected) in [
            ("package/l", EntryType::Symlink, "symlink"),
            ("package/h", EntryType::Link, "hardlink"),
            ("package/c", EntryType::Char, "character device"),
            ("package/f", EntryType::Fifo, "fifo"),
        ] {
            let refused = check_entry_type(Path::new(path), entry_type).unwrap_err();
            assert_eq!(
                refused,
                LimitViolation::EntryType {
                    path: path.into(),
                    kind: expected
                }
            );
        }
        for path in ["../etc/passwd", "package/../../x", "/etc/passwd"] {
            assert!(matches!(
                check_path(Path::new(path)),
                Err(LimitViolation::EscapingPath { .. })
            ));
        }
        assert_eq!(check_path(Path::new("package/./a.yaml")), Ok(()));
    }

    #[test]
    fn the_stream_stops_at_the_total_and_at_the_ratio() {
        let limits = ImageLimits::default();
        let zeros = vec![0u8; 3 * MIB as usize];
        let mut within = BoundedStream::new(zeros.as_slice(), 4 * MIB, None, &limits);
        assert_eq!(
            std::io::copy(&mut within, &mut std::io::sink()).unwrap(),
            3 * MIB
        );
        let mut over = BoundedStream::new(zeros.as_slice(), 2 * MIB, None, &limits);
        let error = std::io::copy(&mut over, &mut std::io::sink()).unwrap_err();
        assert_eq!(
            LimitViolation::of(&error),
            Some(LimitViolation::UnpackedBytes { limit: 2 * MIB })
        );
        // 3 MiB out of a 10 KiB layer is over 100:1; under 1 MiB nothing is checked.
        let mut bomb = BoundedStream::new(zeros.as_slice(), 64 * MIB, Some(10 * 1024), &limits);
        let error = std::io::copy(&mut bomb, &mut std::io::sink()).unwrap_err();
        assert!(matches!(
            LimitViolation::of(&error),
            Some(LimitViolation::CompressionRatio { ratio: 100, .. })
        ));
        let small = vec![0u8; 512 * 1024];
        let mut tiny = BoundedStream::new(small.as_slice(), 64 * MIB, Some(100), &limits);
        assert!(std::io::copy(&mut tiny, &mut std::io::sink()).is_ok());
    }

    #[test]
    fn a_file_over_its_limit_is_refused_after_reading_one_byte_more() {
        let limits = ImageLimits {
            max_file_bytes: 4,
            ..ImageLimits::default()
        };
        assert_eq!(read_file(&mut &b"four"[..], "a", &limits).unwrap(), b"four");
        let error = read_file(&mut &b"five!"[..], "a", &limits).unwrap_err();
        assert_eq!(
            LimitViolation::of(&error),
            Some(LimitViolation::FileBytes {
                path: "a".into(),
                limit: 4
            })
        );
    }
}
