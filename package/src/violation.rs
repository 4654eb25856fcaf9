//! What is wrong with a package, worded as Package Operator words it, so scripts that grep upstream's
//! messages keep working: `<Reason>[ in <path>[ idx <n>]][: <details>][\n<subject>]`.
//!
//! Pure formatting; the checks that produce violations live in the loader and its neighbours.

use std::fmt;

/// Upstream's reasons, verbatim.
pub mod reason {
    pub const EMPTY_PACKAGE: &str = "Package image contains no files. Might be corrupted.";
    pub const MANIFEST_NOT_FOUND: &str = "PackageManifest not found";
    pub const UNKNOWN_GVK: &str = "unknown GVK";
    pub const MANIFEST_INVALID: &str = "PackageManifest invalid";
    pub const MANIFEST_DUPLICATED: &str = "PackageManifest present multiple times";
    pub const LOCK_INVALID: &str = "PackageManifestLock invalid";
    pub const LOCK_DUPLICATED: &str = "PackageManifestLock present multiple times";
    pub const INVALID_YAML: &str = "Invalid YAML";
    pub const MISSING_PHASE_ANNOTATION: &str = "Missing package-operator.run/phase Annotation";
    pub const MISSING_GVK: &str = "GroupVersionKind not set";
    pub const DUPLICATE_OBJECT: &str = "Duplicate Object";
    pub const LABELS_INVALID: &str = "Labels invalid";
    pub const UNSUPPORTED_SCOPE: &str = "Package unsupported scope";
    pub const COMPONENTS_NOT_ENABLED: &str = "Components not enabled";
    pub const COMPONENT_NOT_FOUND: &str = "Component not found";
    pub const NESTED_MULTI_COMPONENT: &str = "Nesting multi-component packages not allowed";
    pub const FILE_IN_COMPONENTS_DIR: &str =
        "The components directory may only contain folders and dot files";
    pub const LOCK_MISSING_IMAGE: &str = "Missing image in manifest.lock.yaml, but using PackageManifest.spec.images. Try running: kubectl package update";
    pub const LOCK_IMAGE_MISMATCH: &str =
        "Image specified in manifest does not match with lockfile. Try running: kubectl package update";
    pub const UNKNOWN_PHASE: &str = "Phase name not found in manifest";
    /// pko's own: annotations pko reads from objects must parse.
    pub const ANNOTATION_INVALID: &str = "Annotation invalid";
}

/// One violation: a reason, where (file, document index), what exactly, and the offending text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Violation {
    pub reason: &'static str,
    pub path: Option<String>,
    pub index: Option<usize>,
    pub component: Option<String>,
    pub details: String,
    pub subject: String,
}

impl Violation {
    pub fn new(reason: &'static str) -> Self {
        Violation {
            reason,
            ..Default::default()
        }
    }

    pub fn in_file(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    pub fn at(mut self, path: impl Into<String>, index: usize) -> Self {
        self.path = Some(path.into());
        self.index = Some(index);
        self
    }

    pub fn component(mut self, component: impl Into<String>) -> Self {
        self.component = Some(component.into());
        self
    }

    pub fn details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = subject.into();
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason)?;
        if let Some(path) = &self.path {
            write!(f, " in {path}")?;
            if let Some(index) = self.index {
                write!(f, " idx {index}")?;
            }
        }
        if let Some(component) = &self.component {
            write!(f, " [{component}]")?;
        }
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        let subject = self.subject.trim();
        if !subject.is_empty() {
            write!(f, "\n{subject}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_upstream() {
        assert_eq!(
            Violation::new(reason::MISSING_PHASE_ANNOTATION)
                .at("test.yaml", 0)
                .to_string(),
            "Missing package-operator.run/phase Annotation in test.yaml idx 0"
        );
        assert_eq!(
            Violation::new(reason::MANIFEST_NOT_FOUND)
                .details("searched at manifest.yaml and manifest.yml")
                .to_string(),
            "PackageManifest not found: searched at manifest.yaml and manifest.yml"
        );
        assert_eq!(
            Violation::new(reason::INVALID_YAML)
                .at("d.yaml", 1)
                .details("oops")
                .subject("\n a: [\n\n")
                .to_string(),
            "Invalid YAML in d.yaml idx 1: oops\na: ["
        );
    }
}
