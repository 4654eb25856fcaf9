//! Unpacked packages by manifest digest, within a byte budget: the image store's cache. It owns what
//! the cache keeps and drops; it must not reach a registry.

use std::sync::Arc;

use lru::LruCache;

use super::files::PackageFiles;

/// Unpacked packages by manifest digest, with their size; least recently used go first past the budget.
pub(crate) struct DigestCache {
    entries: LruCache<String, (Arc<PackageFiles>, u64)>,
    bytes: u64,
    budget: u64,
}

impl DigestCache {
    /// An empty cache that keeps at most `budget` bytes of packages.
    pub(crate) fn new(budget: u64) -> Self {
        Self {
            entries: LruCache::unbounded(),
            bytes: 0,
            budget,
        }
    }

    /// Bytes of the packages held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn get(&mut self, digest: &str) -> Option<Arc<PackageFiles>> {
        self.entries.get(digest).map(|(files, _)| files.clone())
    }

    /// Keeps `files` unless it alone is larger than the budget, dropping the least recently used.
    pub(crate) fn insert(&mut self, digest: String, files: Arc<PackageFiles>) {
        let size = files_size(&files);
        if size > self.budget {
            return;
        }
        if let Some((_, replaced)) = self.entries.put(digest, (files, size)) {
            self.bytes -= replaced;
        }
        self.bytes += size;
        while self.bytes > self.budget {
            let Some((_, (_, dropped))) = self.entries.pop_lru() else {
                break;
            };
            self.bytes -= dropped;
        }
    }
}

/// Bytes a package holds in memory (paths and contents).
fn files_size(files: &PackageFiles) -> u64 {
    files
        .iter()
        .map(|(path, content)| (path.len() + content.len()) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_digest_cache_keeps_within_its_bytes_dropping_the_least_recently_used() {
        let mut cache = DigestCache::new(100);
        let package = |size: usize| {
            let files: PackageFiles = [("f".to_owned(), vec![b'x'; size - 1])].into();
            Arc::new(files)
        };
        cache.insert("a".into(), package(40));
        cache.insert("b".into(), package(40));
        assert!(cache.get("a").is_some(), "a is now the most recently used");
        cache.insert("c".into(), package(40));
        assert!(cache.get("b").is_none(), "b was the least recently used");
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        assert_eq!(cache.bytes(), 80);
        cache.insert("huge".into(), package(101));
        assert!(
            cache.get("huge").is_none(),
            "larger than the whole budget: not kept"
        );
        assert_eq!(cache.bytes(), 80);
    }
}
