//! Package loading: from the files of a package (a directory, or an OCI image's `package/` tree pulled and
//! unpacked within limits by `image.rs`) to its manifest and the objects of each phase, with every
//! problem named in Package Operator's words.
//!
//! Pure apart from reading a directory (`files.rs`) and the registry (`image.rs`); the manager's Package
//! actor and `kubectl-package` share it. Depends on `pko-proto` only among pko's crates: no actors, no
//! NATS, no apiserver client.

pub mod canonical_hash;
pub mod cel;
pub mod chunking;
pub mod components;
pub mod config;
mod digest_cache;
pub mod environment;
pub mod files;
pub mod filtering;
pub mod hbs_template;
pub mod image;
pub mod image_limits;
pub mod image_lock;
pub mod image_reference;
pub mod loader;
pub mod manifest;
pub mod object_checks;
pub mod oci_layout;
pub mod pull_auth;
pub mod registry_slots;
pub mod render_budget;
pub mod sprig_funcs;
pub mod template;
pub mod template_funcs;
pub mod template_test_cases;
pub mod template_values;
pub mod violation;
pub mod yaml;
